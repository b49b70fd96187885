"""gpumem as PyTorch's CUDA allocator.

    import gpumem.torch
    gpumem.torch.install()          # before the first CUDA tensor
    ...                              # torch.cuda.memory_stats(), memory_summary(), empty_cache(),
                                     # Tensor.record_stream() etc. keep working, backed by gpumem

Unmodified scripts: put gpumem's ``python`` folder on PYTHONPATH and set GPUMEM_TORCH=1 (or to a
GPUMEM_CONF-style string): ``PYTHONPATH=/path/to/gpumem/python GPUMEM_TORCH=1 python train.py``.
GPUMEM_TORCH unset, empty, 0, false, no or off: not installed. Or run ``python -m gpumem.torch train.py
ARGS``, which runs the script as ``python train.py ARGS`` would (its folder first on sys.path), with gpumem
installed (with GPUMEM_TORCH's configuration, if it holds one).

The translation layer is a small C++ extension (torch_adapter.cpp) compiled against the installed
torch on first use and cached by torch.utils.cpp_extension; all logic stays in libgpumem.
"""
import json
import os
import sys

import gpumem

_extension = None
_installed_config = ""
_OFF = ("", "0", "false", "no", "off")  # GPUMEM_TORCH values that mean "not installed" (sitecustomize.py too)


def configuration_from_environment():
    """GPUMEM_TORCH's meaning: None (unset or off), "" (1: the defaults) or the configuration it holds."""
    setting = os.environ.get("GPUMEM_TORCH")
    if setting is None or setting.strip().lower() in _OFF:
        return None
    return "" if setting.strip() == "1" else setting


def _adapter():
    global _extension
    if _extension is None:
        try:
            from torch.utils.cpp_extension import load
        except ImportError as error:
            raise ImportError("gpumem.torch needs PyTorch") from error
        here = os.path.dirname(os.path.abspath(__file__))
        library = gpumem.library_path()
        include = gpumem.include_path()
        if include is None:
            raise ImportError("gpumem.torch: gpumem.h not found (not in a gpumem checkout, not recorded by "
                              "cmake --install); pip-install PREFIX/share/gpumem/python from an installed prefix")
        _extension = load(name="gpumem_torch_adapter", sources=[os.path.join(here, "torch_adapter.cpp")],
                          extra_include_paths=[include], with_cuda=True, extra_cflags=["-O2"],
                          extra_ldflags=[f"-L{os.path.dirname(library)}", "-lgpumem",
                                         f"-Wl,-rpath,{os.path.dirname(library)}"],
                          verbose=os.environ.get("GPUMEM_VERBOSE_BUILD") == "1")
    return _extension


def install(config=""):
    """Make gpumem the CUDA allocator of this process.

    ``config`` is applied on top of GPUMEM_CONF (e.g. "engine:segments"). Must run before CUDA is
    initialized. Installing again with the same configuration, or with none (""; as a script does that
    GPUMEM_TORCH=KEYS installed for), is harmless; with another one it warns (RuntimeWarning) that the
    allocator in place keeps its own, and the program goes on (a script that calls install(KEYS) itself
    still runs under `gpumem run` or GPUMEM_TORCH=1). A bad configuration raises gpumem.GpumemError at
    once, with nothing swapped (PyTorch keeps its own allocator).
    """
    import torch
    global _installed_config
    if is_installed():
        if config and config != _installed_config:
            import warnings
            warnings.warn(f"gpumem.torch.install({config!r}): gpumem is installed already, with "
                          f"{_installed_config!r}, which stays: the configuration cannot change in this process "
                          "(set GPUMEM_TORCH or GPUMEM_CONF to the one wanted, or call install() once)",
                          RuntimeWarning, stacklevel=2)
        return
    # A bad configuration stops here, before anything is built or swapped (PyTorch keeps its own
    # allocator), rather than at the first CUDA tensor; the error names the variable it came from.
    source = " (GPUMEM_TORCH)" if config and config == os.environ.get("GPUMEM_TORCH") else ""
    gpumem.check_configuration(config, f"gpumem.torch.install({config!r}){source}")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gpumem.torch.install() must run before CUDA is initialized: call it before the first CUDA "
            "tensor, torch.cuda.init() or any torch.cuda memory call (or set GPUMEM_TORCH=1 and put "
            "gpumem's python folder on PYTHONPATH, so that it runs when torch is imported).")
    _adapter().install(config)
    _installed_config = config
    if os.environ.get("GPUMEM_RUN_OUTPUT"):
        import atexit
        atexit.register(_write_run_history, os.environ["GPUMEM_RUN_OUTPUT"])


def _write_run_history(folder):
    """At exit under ``gpumem run --report``: each device's history and final snapshot, for the report."""
    for device in _extension.created_devices():
        allocator = gpumem.Allocator.attach(_extension.handle(device))
        for kind, text in (("history", allocator.history_json), ("snapshot", lambda: json.dumps(allocator.snapshot()))):
            path = os.path.join(folder, f"{kind}.{os.getpid()}.{device}.json")
            try:
                with open(path + ".tmp", "w") as out:
                    out.write(text())
                os.replace(path + ".tmp", path)
            except (OSError, gpumem.GpumemError) as error:
                print(f"gpumem: cannot write {path} for gpumem run's report: {error}", file=sys.stderr)


def installed_config():
    """The configuration given to install() (GPUMEM_CONF applies under it)."""
    return _installed_config


def is_installed():
    return _extension is not None and _extension.is_installed()


def device_index(device=None):
    """The index of a CUDA device named as torch.cuda's functions take it: None (the current device), an
    int, a str ("cuda", "cuda:1") or a torch.device."""
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"gpumem.torch: a device is an int, a str or a torch.device, not {type(device).__name__}")
    if not isinstance(device, int):
        named = device if isinstance(device, torch.device) else torch.device(device)
        if named.type != "cuda":
            raise ValueError(f"gpumem.torch: {device!r} is not a CUDA device")
        device = torch.cuda.current_device() if named.index is None else named.index
    if not 0 <= device < torch.cuda.device_count():
        raise ValueError(f"gpumem.torch: no CUDA device {device} (this process sees {torch.cuda.device_count()})")
    return device


def allocator(device=None):
    """The gpumem.Allocator behind a CUDA device (for gpumem's own statistics and summary); ``device`` as
    torch.cuda's functions take it (device_index)."""
    if not is_installed():
        raise RuntimeError("gpumem is not installed as the CUDA allocator")
    return gpumem.Allocator.attach(_extension.handle(device_index(device)))


def defragment(device=None, min_free_bytes=0):
    """Give back the device memory that live tensors pin inside gpumem's chunks (whole free pages that
    torch.cuda.empty_cache() cannot return): the tensors' pages are copied to new memory at the same
    addresses. Waits for the device; call it between steps, from the thread that launches the work.
    Returns the bytes given back."""
    return allocator(device).defragment(min_free_bytes)


def _defragment_if_possible():
    """defragment(), or 0 where it cannot run (engine:segments, a CUDA graph being captured): for adaptive,
    which then splits the step as it would without."""
    try:
        return defragment()
    except gpumem.GpumemError:
        return 0


def pressure_is_high(device=None):
    """Whether gpumem's pressure level on the device is above normal (a policy must be set:
    GPUMEM_CONF pressure_high:F, or allocator().set_pressure_policy(...))."""
    return allocator(device).pressure()["level"] != "normal"


def adaptive(loss_of, model, **options):
    """A training step that splits itself into micro-batches when memory is short (gpumem.governor).
    Under gpumem it also splits ahead of trouble when gpumem's pressure level is high, and meets an
    out-of-memory error by defragmenting first."""
    from gpumem import governor
    if "pressure" not in options and is_installed():
        options["pressure"] = pressure_is_high
    if "defragment" not in options and is_installed():
        options["defragment"] = _defragment_if_possible
    return governor.adaptive(loss_of, model, **options)


def watch_leaks(steps=5, warmup=2, log=None):
    """Warns once when live memory grows at every step boundary (gpumem.governor)."""
    from gpumem import governor
    return governor.watch_leaks(steps, warmup, log)


def find_batch_size(step, make_batch, **options):
    """The largest batch whose step fits, in three trials (gpumem.batch_size)."""
    from gpumem import batch_size
    return batch_size.find_batch_size(step, make_batch, **options)


def __getattr__(name):
    """gpumem.torch.governor, imported when first used (it needs torch; this module does not)."""
    if name == "governor":
        from gpumem import governor
        return governor
    raise AttributeError(f"module 'gpumem.torch' has no attribute '{name}'")


def _main():
    """python -m gpumem.torch SCRIPT ARGS: run a script with gpumem as the CUDA allocator, as
    ``python SCRIPT ARGS`` runs it: its folder in place of this one's first on sys.path."""
    import runpy
    import zipfile
    if len(sys.argv) < 2:
        sys.exit("usage: python -m gpumem.torch SCRIPT [ARGS...]")
    if not os.path.exists(sys.argv[1]):  # as python says it (and its status 2), before CUDA is touched
        print(f"python -m gpumem.torch: can't open file {sys.argv[1]!r}: no such file or directory", file=sys.stderr)
        sys.exit(2)
    install(configuration_from_environment() or "")
    sys.argv = sys.argv[1:]
    script = sys.argv[0]
    if not os.path.isdir(script) and not zipfile.is_zipfile(script):  # those run_path puts on sys.path itself
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # as python does, symbolic links followed
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    # Run as gpumem.torch, not as __main__ (a second copy of this module): the script's `import gpumem.torch`
    # must find the module that installed gpumem (is_installed(), allocator()).
    from gpumem import torch as _installed_module
    _installed_module._main()
