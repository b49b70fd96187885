"""Makes gpumem PyTorch's CUDA allocator in unmodified scripts.

With gpumem's ``python`` folder on PYTHONPATH and GPUMEM_TORCH set (to 1, or to a GPUMEM_CONF-style
string for gpumem), gpumem is installed as soon as ``torch`` is imported, before anything can touch
CUDA. Without GPUMEM_TORCH, or with it empty, 0, false, no or off, this does nothing. Any other
sitecustomize on the path still runs.
"""
import importlib.abc
import importlib.util
import os
import sys

_OFF = ("", "0", "false", "no", "off")  # as gpumem/torch.py's (not imported here: every interpreter runs this)


class _InstallAfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            import gpumem.torch
            gpumem.torch.install(gpumem.torch.configuration_from_environment() or "")

        spec.loader.exec_module = exec_module
        return spec


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(os.path.dirname(candidate)) != here and os.path.isfile(candidate):
            with open(candidate) as source:
                exec(compile(source.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
            return


if os.environ.get("GPUMEM_TORCH", "").strip().lower() not in _OFF:
    sys.meta_path.insert(0, _InstallAfterTorch())
_run_next_sitecustomize()
