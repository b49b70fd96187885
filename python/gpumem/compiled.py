"""The package's compiled parts: CPython extension modules built on first use with the C compiler Python
was built with and cached, as torch.utils.cpp_extension builds gpumem.torch's adapter. A module is built
from `name`.c, or from the files SOURCES lists for it (cupy_allocate: cupy_allocate.c, cupy_pinned.c and
cupy_objects.c, which include cupy_allocate.h), compiled together.

    module = gpumem.compiled.load("cupy_allocate")   # the module _gpumem_cupy_allocate

Such a module links to nothing but Python (libgpumem's functions reach it as addresses), so one build
serves every libgpumem. The cache is $GPUMEM_CACHE_DIR, else $XDG_CACHE_HOME/gpumem (~/.cache/gpumem),
or where that cannot be written a folder of the user's in the temporary directory. A build's name
carries a digest of its files (headers included) and of the Python it is for, so that a changed file or
another Python builds anew. A build is written under a temporary name and renamed, so that processes
building at once never load a half-written file; a folder that is not the user's own, or that others may
write in, is neither built in nor loaded from. A failed build raises BuildError with the compiler's
command and output.
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_loaded = {}
# name -> (the C files compiled into the module _gpumem_`name`, the first holding its PyInit; the headers
# they include). A name not listed is built from `name`.c alone.
SOURCES = {"cupy_allocate": (("cupy_allocate.c", "cupy_pinned.c", "cupy_objects.c"), ("cupy_allocate.h",))}


class BuildError(ImportError):
    """A compiled part could not be built (no compiler, no Python headers, or the compiler failed)."""


def cache_folders():
    """Where builds are kept, in order: $GPUMEM_CACHE_DIR alone when it is set; else the user's cache,
    then a folder of this user's in the temporary directory (for a home that cannot be written)."""
    chosen = os.environ.get("GPUMEM_CACHE_DIR")
    if chosen:
        return [chosen]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "gpumem"), os.path.join(tempfile.gettempdir(), f"gpumem-{os.getuid()}")]


def _owned_by_this_user(folder):
    """Whether `folder` is this user's and no one else may write in it: a build loaded from elsewhere
    could be anyone's code (the temporary directory is shared)."""
    try:
        status = os.stat(folder)
    except OSError:
        return False
    return status.st_uid == os.getuid() and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def compile_command(sources, target):
    """The compiler's command line that builds `sources` (a C file's path, or a list of them) into the
    extension module `target`: $CC, else the compiler Python was built with where it is installed, else cc."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if not os.environ.get("CC") and not shutil.which(shlex.split(compiler)[0]):
        compiler = "cc"
    include = sysconfig.get_paths()["include"]
    sources = [sources] if isinstance(sources, str) else list(sources)
    return [*shlex.split(compiler), "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", f"-I{include}", *sources,
            "-o", target]


def source_files(name):
    """(the paths of the C files module `name` is built from, the paths of the headers they include)."""
    sources, headers = SOURCES.get(name, ((f"{name}.c",), ()))
    return [os.path.join(_HERE, file) for file in sources], [os.path.join(_HERE, file) for file in headers]


def build_file_name(name):
    """The file name of module `name`'s build: a digest of its files and of the Python it is for."""
    sources, headers = source_files(name)
    texts = []
    for path in sources + headers:
        try:
            with open(path, "rb") as source:
                texts.append(source.read())
        except OSError as error:
            raise BuildError(f"gpumem: cannot read {os.path.basename(path)}: {error}") from None
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}".encode()
    digest = hashlib.sha256(b"\0".join([*texts, tag])).hexdigest()[:16]
    return f"_gpumem_{name}-{digest}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def _partial_file(name, file_name):
    """(target, a new temporary file beside it) in the first cache folder that can be written."""
    failures = []
    for folder in cache_folders():
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if not _owned_by_this_user(folder):
                failures.append(f"{folder} (not this user's, or others may write in it)")
                continue
            handle, partial = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=folder)
            os.close(handle)
            return os.path.join(folder, file_name), partial
        except OSError as error:
            failures.append(f"{folder} ({error.strerror})")
    raise BuildError(f"gpumem: cannot write the build of {name}.c to {' or '.join(failures)}; "
                     "set GPUMEM_CACHE_DIR to a folder this user can write")


def build(name, file_name):
    """Compile module `name`'s C files (source_files) into `file_name` in a cache folder (renamed into
    place once complete); returns its path."""
    sources, _ = source_files(name)
    target, partial = _partial_file(name, file_name)
    command = compile_command(sources, partial)
    try:
        finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        os.unlink(partial)
        raise BuildError(f"gpumem: cannot build {name}.c: {' '.join(command)}: {error}") from None
    if finished.returncode != 0:
        os.unlink(partial)
        raise BuildError(f"gpumem: building {name}.c failed ({' '.join(command)}):\n{finished.stderr.strip()}")
    os.replace(partial, target)
    return target


def load(name):
    """The extension module _gpumem_`name`, built from its files (source_files) first if need be."""
    module = _loaded.get(name)
    if module is not None:
        return module
    file_name = build_file_name(name)
    built = [os.path.join(folder, file_name) for folder in cache_folders()
             if _owned_by_this_user(folder) and os.path.exists(os.path.join(folder, file_name))]
    target = built[0] if built else build(name, file_name)
    spec = importlib.util.spec_from_file_location(f"_gpumem_{name}", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded[name] = module
    return module
