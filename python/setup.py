"""Builds in a scratch folder, so that pip can install from a folder it cannot write to (an installed
prefix's share/gpumem/python) and leaves no build/ or gpumem.egg-info next to the sources. The package's
metadata is in pyproject.toml."""
import atexit
import shutil
import tempfile

import setuptools

scratch = tempfile.mkdtemp(prefix="gpumem-python-build-")
atexit.register(shutil.rmtree, scratch, True)
setuptools.setup(options={"build": {"build_base": f"{scratch}/build"}, "egg_info": {"egg_base": scratch}})
