"""gpumem: a GPU memory manager, from Python.

A thin ctypes layer over libgpumem (the C library does all the work). Importable without PyTorch;
``gpumem.torch`` makes gpumem PyTorch's CUDA allocator and ``gpumem.cupy`` CuPy's.

The library is found, in this order, through the environment variable GPUMEM_LIBRARY, next to this
package, in the repository's build folders (build/, build-gpu/) when the package sits in a gpumem
checkout, at the path `cmake --install` recorded (for a package pip-installed from PREFIX/share/gpumem/python),
or on the dynamic linker's search path (libgpumem.so.0). ``library_path()`` says which one is used.

    import gpumem
    allocator = gpumem.Allocator("backend:sim,capacity:16GiB")
    pointer = allocator.malloc(1 << 20)
    allocator.free(pointer)
    print(allocator.summary())
    allocator.memory_stats()["allocated_bytes.all.peak"]

Memory pressure (the C library's gm_set_pressure_policy / gm_on_pressure, docs in gpumem.h; gpumem.pressure
keeps each callback's C function alive by the allocator's address, whichever wrapper registered it):

    allocator.set_pressure_policy(high=0.9, low=0.8)          # fractions of the memory limit (or device)
    allocator.on_pressure(lambda level, readings: ...)        # "high", "normal", "critical"
    allocator.pressure()["level"]
"""
import ctypes
import json
import math
import operator
import os

__all__ = ["Allocator", "GpumemError", "OutOfMemoryError", "config_help", "check_configuration", "library_path",
           "include_path", "STATUS_NAMES", "PRESSURE_LEVELS", "PRESSURE_SIGNALS", "OOM_CAUSES"]
__version__ = "0.1.0"  # read by pyproject.toml; CMakeLists.txt checks it against the project's version

from gpumem import pressure as _pressure
from gpumem.pressure import PRESSURE_LEVELS, PRESSURE_SIGNALS

try:
    from gpumem import _install_paths  # written by `cmake --install`; absent in the sources
except ImportError:
    _install_paths = None

STATUS_NAMES = {
    0: "success", 1: "invalid argument", 2: "out of memory", 3: "invalid pointer", 4: "bad configuration",
    5: "no device", 6: "device error", 7: "not supported", 8: "input/output error", 9: "malformed input",
    10: "inconsistent allocator state", 11: "buffer too small",
}
_OUT_OF_MEMORY = 2
_BUFFER_TOO_SMALL = 11
_POOLS = ("all", "small_pool", "large_pool")
# gpumem.h's gm_oom_cause, by name (its pressure levels and signals: gpumem.pressure).
OOM_CAUSES = ("none", "capacity", "fragmentation", "other_processes", "memory_limit", "host", "source",
              "address_space")


class GpumemError(RuntimeError):
    """A gpumem call failed; ``status`` is its code and the message says why (``reason``: the message
    without the status's name in front)."""

    def __init__(self, status, message):
        super().__init__(f"{STATUS_NAMES.get(status, 'error')}: {message}")
        self.status = status
        self.reason = message


class OutOfMemoryError(GpumemError):
    """The device has no room for the request; the message is gpumem's out-of-memory report, and ``cause``
    its primary cause (one of OOM_CAUSES: "capacity", "fragmentation", "other_processes", "memory_limit",
    "host", "source": the allocator a MemPool's memory comes from, "address_space": the device's virtual
    addresses, with very many streams)."""

    def __init__(self, status, message, cause="none"):
        super().__init__(status, message)
        self.cause = cause


class _Stat(ctypes.Structure):
    _fields_ = [("current", ctypes.c_int64), ("peak", ctypes.c_int64), ("allocated", ctypes.c_int64),
                ("freed", ctypes.c_int64)]


class _HostStats(ctypes.Structure):
    """gm_host_stats (gpumem.h): the pinned host cache's statistics."""
    _fields_ = [("allocated_bytes", _Stat), ("reserved_bytes", _Stat), ("allocations", _Stat),
                ("requested_bytes", ctypes.c_int64), ("cache_hits", ctypes.c_int64), ("cache_misses", ctypes.c_int64),
                ("host_allocations", ctypes.c_int64), ("host_frees", ctypes.c_int64),
                ("pending_blocks", ctypes.c_int64), ("limit", ctypes.c_uint64)]


class _DeviceInfo(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char * 16), ("name", ctypes.c_char * 128), ("device", ctypes.c_int),
                ("device_count", ctypes.c_int), ("driver_version", ctypes.c_int),
                ("total_bytes", ctypes.c_uint64), ("free_bytes", ctypes.c_uint64),
                ("virtual_memory", ctypes.c_int), ("granularity", ctypes.c_uint64), ("engine", ctypes.c_char * 16)]


_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_IN_CHECKOUT = os.path.isfile(os.path.join(_ROOT, "include", "gpumem.h"))
_SONAME = "libgpumem.so.0"


def _candidates():
    """(where, path) for each place to look after GPUMEM_LIBRARY, in order; (where, None, why not) for a
    place that does not apply."""
    yield "next to the package", os.path.join(_HERE, "libgpumem.so")
    if _IN_CHECKOUT:
        for build in ("build", "build-gpu"):
            yield "the repository's build folder", os.path.join(_ROOT, build, "libgpumem.so")
    else:
        yield "the repository's build folders", None, "this package is not in a gpumem checkout"
    if _install_paths is not None:
        yield "installed by cmake --install", _install_paths.library
    else:
        yield "installed by cmake --install", None, "no record (pip-install PREFIX/share/gpumem/python to have one)"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def _loaded_from(library):
    """The file the dynamic linker loaded `library` from (its name if that cannot be told)."""
    for source in (None, "libdl.so.2"):  # dladdr is in libc since glibc 2.34, in libdl before
        try:
            dladdr = ctypes.CDLL(source).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(ctypes.cast(library.gm_create, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
    return _SONAME


def library_path():
    """The path of the libgpumem.so this package uses."""
    chosen = os.environ.get("GPUMEM_LIBRARY")
    if chosen:
        if not os.path.isfile(chosen):
            raise ImportError(f"gpumem: GPUMEM_LIBRARY is set to {chosen}, but libgpumem.so not found there")
        return os.path.abspath(chosen)
    tried = ["  GPUMEM_LIBRARY: not set"]
    for where, path, *why_not in _candidates():
        if path is not None and os.path.isfile(path):
            return os.path.abspath(path)
        tried.append(f"  {where}: {path or why_not[0]}")
    try:
        return _loaded_from(ctypes.CDLL(_SONAME))
    except OSError as error:
        tried.append(f"  the dynamic linker's search path: {error}")
    raise ImportError("gpumem: libgpumem.so not found; tried:\n" + "\n".join(tried) + "\n"
                      "Build it (cmake -S . -B build && cmake --build build), install it (cmake --install build), "
                      "or set GPUMEM_LIBRARY to its path")


def include_path():
    """The folder holding gpumem.h: the repository's include/ when this package sits in a gpumem checkout,
    else the one `cmake --install` recorded, else this package's own folder if gpumem.h was put there;
    None if none of these."""
    if _IN_CHECKOUT:
        return os.path.join(_ROOT, "include")
    for folder in ([_install_paths.include_directory] if _install_paths is not None else []) + [_HERE]:
        if os.path.isfile(os.path.join(folder, "gpumem.h")):
            return folder
    return None


def _where(path):
    """How the user named `path`, for messages: GPUMEM_LIBRARY=path when it came from there."""
    return f"GPUMEM_LIBRARY={path}" if os.environ.get("GPUMEM_LIBRARY") else path


def _load():
    path = library_path()
    try:
        library = ctypes.CDLL(path)
    except OSError as error:  # not a shared library, or one for another machine
        raise ImportError(f"gpumem: {_where(path)} cannot be loaded: {error}") from None
    pointer, status = ctypes.c_void_p, ctypes.c_int
    signatures = {
        "gm_strerror": (ctypes.c_char_p, [status]),
        "gm_last_error": (ctypes.c_char_p, []),
        "gm_create": (status, [ctypes.c_char_p, ctypes.POINTER(pointer)]),
        "gm_create_from_environment": (status, [ctypes.c_char_p, ctypes.POINTER(pointer)]),
        "gm_destroy": (None, [pointer, ctypes.POINTER(ctypes.c_size_t)]),
        "gm_config_help": (ctypes.c_char_p, []),
        "gm_check_configuration": (status, [ctypes.c_char_p]),
        "gm_malloc": (status, [pointer, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(pointer)]),
        "gm_malloc_on_borrowed_stream": (status, [pointer, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(pointer)]),
        "gm_free": (status, [pointer, pointer]),
        "gm_record_stream": (status, [pointer, pointer, ctypes.c_size_t]),
        "gm_empty_cache": (status, [pointer]),
        "gm_defragment": (status, [pointer, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]),
        "gm_holds_stream": (status, [pointer, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]),
        "gm_enable_peer_access": (status, [pointer, ctypes.c_int]),
        "gm_allocation_size": (status, [pointer, pointer, ctypes.POINTER(ctypes.c_size_t)]),
        "gm_set_memory_limit": (status, [pointer, ctypes.c_uint64]),
        "gm_get_memory_limit": (status, [pointer, ctypes.POINTER(ctypes.c_uint64)]),
        "gm_get_stats": (status, [pointer, ctypes.c_void_p]),
        "gm_snapshot_take": (status, [pointer, ctypes.POINTER(ctypes.c_void_p)]),
        "gm_snapshot_free": (None, [ctypes.c_void_p]),
        "gm_snapshot_json": (status, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]),
        "gm_history_json": (status, [pointer, ctypes.POINTER(ctypes.c_void_p)]),
        "gm_json_free": (None, [ctypes.c_void_p]),
        "gm_stat_name": (ctypes.c_char_p, [ctypes.c_size_t]),
        "gm_counter_name": (ctypes.c_char_p, [ctypes.c_size_t]),
        "gm_device_call_count": (ctypes.c_size_t, []),
        "gm_device_call_name": (ctypes.c_char_p, [ctypes.c_int]),
        "gm_reset_peak_stats": (status, [pointer]),
        "gm_reset_accumulated_stats": (status, [pointer]),
        "gm_summary": (status, [pointer, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "gm_validate": (status, [pointer]),
        "gm_get_device_info": (status, [pointer, ctypes.POINTER(_DeviceInfo)]),
        "gm_last_oom_cause": (ctypes.c_int, []),
        "gm_set_pressure_policy": (status, [pointer, ctypes.POINTER(_pressure.PressurePolicy)]),
        "gm_get_pressure_policy": (status, [pointer, ctypes.POINTER(_pressure.PressurePolicy)]),
        "gm_get_pressure": (status, [pointer, ctypes.POINTER(_pressure.PressureReadings)]),
        "gm_check_pressure": (status, [pointer, ctypes.POINTER(_pressure.PressureReadings)]),
        "gm_on_pressure": (status, [pointer, _pressure.CALLBACK, ctypes.c_void_p]),
        "gm_remove_pressure_callback": (status, [pointer, _pressure.CALLBACK, ctypes.c_void_p]),
        "gm_sim_set_used_elsewhere": (status, [pointer, ctypes.c_uint64]),
        "gm_host_malloc": (status, [pointer, ctypes.c_size_t, ctypes.POINTER(pointer)]),
        "gm_host_free": (status, [pointer, pointer]),
        "gm_host_free_with_streams": (status, [pointer, pointer, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]),
        "gm_host_record_stream": (status, [pointer, pointer, ctypes.c_size_t]),
        "gm_host_empty_cache": (status, [pointer]),
        "gm_host_get_stats": (status, [pointer, ctypes.POINTER(_HostStats)]),
    }
    missing = [name for name in signatures if not hasattr(library, name)]
    if missing:  # another library, or a libgpumem older than this package
        raise ImportError(f"gpumem: {_where(path)} is not libgpumem: it lacks {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''} (a libgpumem.so "
                          f"of version {__version__} is needed)")
    for name, (result, arguments) in signatures.items():
        function = getattr(library, name)
        function.restype = result
        function.argtypes = arguments
    return library


_library = _load()


def _names(name_of):
    names = []
    while name_of(len(names)) is not None:
        names.append(name_of(len(names)).decode())
    return tuple(names)


# gm_stats as the library describes it (gpumem.h's GM_POOL_STATISTICS and GM_COUNTERS): a statistic added
# there appears here without a change.
_STAT_ARRAYS = _names(_library.gm_stat_name)
_COUNTERS = _names(_library.gm_counter_name)
_CALL_KINDS = tuple(_library.gm_device_call_name(kind).decode() for kind in range(_library.gm_device_call_count()))


class _Stats(ctypes.Structure):
    _fields_ = [(name, _Stat * 3) for name in _STAT_ARRAYS] + [(name, ctypes.c_int64) for name in _COUNTERS] + [
        ("device_calls", ctypes.c_int64 * len(_CALL_KINDS)), ("device_call_ns", ctypes.c_int64),
        ("device_call_ns_by_kind", ctypes.c_int64 * len(_CALL_KINDS)),
        ("device_total_bytes", ctypes.c_uint64), ("page_size", ctypes.c_uint64)]


# Integer arguments are checked here: ctypes would wrap values out of their C type's range silently.


def _integer(value, what):
    """`value` as an int; TypeError naming `what` otherwise."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"gpumem: {what} must be an integer, not {type(value).__name__}") from None


def _unsigned(value, what, bits=64):
    """`value` as an int for an unsigned C argument of `bits` bits named `what` (size_t, uint64_t, uint32_t);
    ValueError or OverflowError instead of the wrapped number ctypes would pass (2**64 + 4096 as 4096,
    -1 as 2**64 - 1)."""
    number = _integer(value, what)
    if number < 0:
        raise ValueError(f"gpumem: {what} must not be negative (got {number})")
    if number >= 1 << bits:
        raise OverflowError(f"gpumem: {what} must be at most 2**{bits} - 1 (got {number})")
    return number


def _pointer(value):
    """A device or host address as a c_void_p: None is NULL (as ctypes has it); an address outside
    0 .. 2**64 - 1 is refused, where ctypes would wrap it (p + 2**64 would name p)."""
    return ctypes.c_void_p(None if value is None else _unsigned(value, "pointer"))


def _text(value, what, none_allowed=False, form=""):
    """A string argument as bytes for the library; TypeError for anything but str (None too, unless
    `none_allowed`: then None, "none given"). `form` says what the string holds, for the message."""
    if value is None and none_allowed:
        return None
    if not isinstance(value, str):
        raise TypeError(f"gpumem: {what} must be a str{form}, not {type(value).__name__}")
    if "\0" in value:  # the library would read the text only up to it
        raise ValueError(f"gpumem: {what} holds a NUL character")
    return value.encode()


_CONFIGURATION = " (GPUMEM_CONF-style KEY:VALUE,...)"


def _fraction(value, what):
    """A float for a gm_pressure_policy field; TypeError for what is not a real number ("0.9", None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"gpumem: {what} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"gpumem: {what} must be a finite number, not {value}")
    return float(value)


def _check(status):
    if status != 0:
        message = _library.gm_last_error().decode(errors="replace")
        if status == _OUT_OF_MEMORY:
            cause = _library.gm_last_oom_cause()
            raise OutOfMemoryError(status, message, OOM_CAUSES[cause] if 0 <= cause < len(OOM_CAUSES) else "unknown")
        if message.endswith(": allocator is NULL"):  # the Python object's handle: zeroed by close()
            message += " (this gpumem.Allocator was closed)"
        raise GpumemError(status, message)


def check_status(status):
    """Raise the error a gpumem status stands for (OutOfMemoryError, GpumemError; with the calling
    thread's last error message); nothing for 0. For compiled callers of the C functions."""
    _check(status)


def function_address(name):
    """The address of one of libgpumem's C functions (gm_malloc, gm_free, ...), for compiled callers."""
    return ctypes.cast(getattr(_library, name), ctypes.c_void_p).value


def _take_text(text):
    """A JSON text the library made, as a str; released."""
    try:
        return ctypes.string_at(text.value).decode()
    finally:
        _library.gm_json_free(text)


def _take_json(text):
    """Parse a JSON text the library made, and release it."""
    try:
        return json.loads(ctypes.string_at(text.value).decode())
    finally:
        _library.gm_json_free(text)


def config_help():
    """Every GPUMEM_CONF key with its default and meaning."""
    return _library.gm_config_help().decode()


def check_configuration(config="", caller=None):
    """Parse GPUMEM_CONF, then ``config`` over it, as an allocator made from the environment would,
    creating nothing: GpumemError (status 4, bad configuration) naming the key and why, its message
    after "``caller``: " when one is given; else None."""
    status = _library.gm_check_configuration(_text(config, "config", True, _CONFIGURATION) or None)
    if status != 0 and caller:
        raise GpumemError(status, f"{caller}: {_library.gm_last_error().decode(errors='replace')}")
    _check(status)


_pressure_callbacks = _pressure.CallbackRegistry()  # every allocator's, by its address (gpumem.pressure)


class Allocator:
    """One gpumem allocator: a backend ("sim", "host", "cuda") and a device.

    ``config`` is a GPUMEM_CONF-style string; with ``from_environment`` (the default) GPUMEM_CONF is read
    first and ``config`` applied on top. ``Allocator.attach(address)`` wraps an allocator owned elsewhere
    (for instance by gpumem.torch) without taking ownership.
    """

    def __init__(self, config="", from_environment=True):
        self._handle, self._owned = None, False  # what close() and __del__ see if the creation fails
        handle = ctypes.c_void_p()
        create = _library.gm_create_from_environment if from_environment else _library.gm_create
        _check(create(_text(config, "config", form=_CONFIGURATION), ctypes.byref(handle)))
        self._handle = handle
        self._owned = True

    @classmethod
    def attach(cls, address):
        allocator = cls.__new__(cls)
        allocator._handle = ctypes.c_void_p(None if address is None else _unsigned(address, "address"))
        allocator._owned = False
        return allocator

    def close(self):
        """Destroy the allocator (its memory goes back to the device); returns the count of live allocations."""
        if self._owned and self._handle:
            live = ctypes.c_size_t()
            # Zeroed in place before the destroy: compiled callers read the handle through its address
            # (handle_address) and must see NULL, which gpumem refuses, never a destroyed allocator.
            handle, self._handle = self._handle, None
            destroyed = ctypes.c_void_p(handle.value)
            handle.value = None
            _library.gm_destroy(destroyed, ctypes.byref(live))
            _pressure_callbacks.forget(destroyed.value)  # C holds none of its callbacks any more
            return live.value
        return 0

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.close()

    @property
    def address(self):
        """The C handle, as an integer."""
        if self._handle is None:
            raise GpumemError(1, "gpumem.Allocator.address: this allocator was closed")
        return self._handle.value

    def malloc(self, size, stream=0, borrowed=False):
        """`borrowed`: the stream's owner may destroy it while its memory is cached, and gpumem never
        names it again (gm_malloc_on_borrowed_stream)."""
        size, stream = _unsigned(size, "size"), _unsigned(stream, "stream")
        pointer = ctypes.c_void_p()
        call = _library.gm_malloc_on_borrowed_stream if borrowed else _library.gm_malloc
        _check(call(self._handle, size, stream, ctypes.byref(pointer)))
        return pointer.value or 0

    def free(self, pointer):
        _check(_library.gm_free(self._handle, _pointer(pointer)))

    def unchecked_functions(self):
        """(malloc(size, stream) -> pointer, free(pointer)) for an adapter's hot path: malloc and free
        without their argument checks (the caller passes ints from 0 to 2**64 - 1), failing as they do.
        A closed allocator's handle is NULL, which gpumem refuses: they never reach freed memory."""
        allocator, gm_malloc, gm_free = self, _library.gm_malloc, _library.gm_free
        c_void_p, byref = ctypes.c_void_p, ctypes.byref

        def malloc(size, stream):
            pointer = c_void_p()
            status = gm_malloc(allocator._handle, size, stream, byref(pointer))
            if status:
                _check(status)
            return pointer.value or 0

        def free(pointer):
            status = gm_free(allocator._handle, pointer)
            if status:
                _check(status)

        return malloc, free

    def record_stream(self, pointer, stream):
        stream = _unsigned(stream, "stream")
        _check(_library.gm_record_stream(self._handle, _pointer(pointer), stream))

    def allocation_size(self, pointer):
        size = ctypes.c_size_t()
        _check(_library.gm_allocation_size(self._handle, _pointer(pointer), ctypes.byref(size)))
        return size.value

    def empty_cache(self):
        _check(_library.gm_empty_cache(self._handle))

    def defragment(self, min_free_bytes=0):
        """Give back the whole free pages of chunks that live blocks pin (gm_defragment): their live pages
        are copied to new memory at the same addresses, after a wait for the whole device. Call it where
        no other thread launches work on the device (between training steps). Returns the bytes given
        back; GpumemError under engine:segments or while a CUDA graph is being captured."""
        released = ctypes.c_uint64()
        _check(_library.gm_defragment(self._handle, _unsigned(min_free_bytes, "min_free_bytes"), ctypes.byref(released)))
        return released.value

    def holds_stream(self, stream):
        """Whether gpumem still keeps memory for ``stream`` (and may call the driver on it later), so that
        the stream must stay alive (gm_holds_stream)."""
        stream = _unsigned(stream, "stream")
        held = ctypes.c_int()
        _check(_library.gm_holds_stream(self._handle, stream, ctypes.byref(held)))
        return bool(held.value)

    def enable_peer_access(self, peer):
        """Let device ``peer`` read and write this allocator's memory, now and later (gm_enable_peer_access):
        what a kernel of one GPU needs to use a CuPy array of another. The driver's peer access between the
        two devices (``cupy.cuda.runtime.deviceEnablePeerAccess``) is the caller's, as without gpumem."""
        if isinstance(peer, bool):
            raise TypeError("gpumem: peer must be an integer, not bool")
        peer = _integer(peer, "peer")
        if not -2**31 <= peer < 2**31:  # a C int: ctypes would pass 2**40 as 0
            raise OverflowError(f"gpumem: peer must be a device number, not {peer}")
        _check(_library.gm_enable_peer_access(self._handle, peer))

    def host_malloc(self, size):
        """Pinned (page-locked) host memory from the allocator's host cache; an address (0 for size 0)."""
        size = _unsigned(size, "size")
        pointer = ctypes.c_void_p()
        _check(_library.gm_host_malloc(self._handle, size, ctypes.byref(pointer)))
        return pointer.value or 0

    def host_free(self, pointer, streams=()):
        """Give a pinned block back. ``streams`` (stream pointers, any iterable) are recorded for it first,
        in the same call (gm_host_free_with_streams): it is not reused before the work queued on them
        until now is done."""
        if not streams:
            _check(_library.gm_host_free(self._handle, _pointer(pointer)))
            return
        streams = [_unsigned(stream, "stream") for stream in streams]
        array = (ctypes.c_size_t * len(streams))(*streams)
        _check(_library.gm_host_free_with_streams(self._handle, _pointer(pointer), array, len(streams)))

    def host_record_stream(self, pointer, stream):
        """The block is used by work on ``stream``: not reused before that work finished."""
        stream = _unsigned(stream, "stream")
        _check(_library.gm_host_record_stream(self._handle, _pointer(pointer), stream))

    def host_empty_cache(self):
        _check(_library.gm_host_empty_cache(self._handle))

    def host_stats(self):
        """The pinned host cache's statistics as a dict: gm_stat readings as dicts, counters as ints."""
        stats = _HostStats()
        _check(_library.gm_host_get_stats(self._handle, ctypes.byref(stats)))
        result = {}
        for name, kind in _HostStats._fields_:
            value = getattr(stats, name)
            result[name] = {field: getattr(value, field) for field, _ in _Stat._fields_} if kind is _Stat else value
        return result

    def set_memory_limit(self, limit_bytes):
        """Never reserve more than this (0: the whole device)."""
        limit_bytes = _unsigned(limit_bytes, "limit_bytes")
        _check(_library.gm_set_memory_limit(self._handle, limit_bytes))

    def memory_limit(self):
        limit = ctypes.c_uint64()
        _check(_library.gm_get_memory_limit(self._handle, ctypes.byref(limit)))
        return limit.value

    def reset_peak_stats(self):
        _check(_library.gm_reset_peak_stats(self._handle))

    def reset_accumulated_stats(self):
        _check(_library.gm_reset_accumulated_stats(self._handle))

    def validate(self):
        """Check every invariant of the heap; raises GpumemError if one is broken."""
        _check(_library.gm_validate(self._handle))

    def memory_stats(self):
        """The statistics under torch.cuda.memory_stats() names, plus gpumem's device-call counters."""
        stats = _Stats()
        _check(_library.gm_get_stats(self._handle, ctypes.byref(stats)))
        result = {}
        for name in _STAT_ARRAYS:
            array = getattr(stats, name)
            for index, pool in enumerate(_POOLS):
                for reading in ("current", "peak", "allocated", "freed"):
                    result[f"{name}.{pool}.{reading}"] = getattr(array[index], reading)
        for name in _COUNTERS + ("device_call_ns",):
            result[name] = getattr(stats, name)
        for index, kind in enumerate(_CALL_KINDS):
            result[f"device_calls.{kind}"] = stats.device_calls[index]
            result[f"device_call_ns.{kind}"] = stats.device_call_ns_by_kind[index]
        return result

    def reserved_bytes(self):
        """Device memory reserved now (memory_stats()["reserved_bytes.all.current"], without the dict)."""
        stats = _Stats()
        _check(_library.gm_get_stats(self._handle, ctypes.byref(stats)))
        return stats.reserved_bytes[0].current

    def snapshot(self):
        """Every region and block with the statistics, as a dict (docs/formats.md, "gpumem-snapshot")."""
        snapshot = ctypes.c_void_p()
        _check(_library.gm_snapshot_take(self._handle, ctypes.byref(snapshot)))
        try:
            text = ctypes.c_void_p()
            _check(_library.gm_snapshot_json(snapshot, ctypes.byref(text)))
            return _take_json(text)
        finally:
            _library.gm_snapshot_free(snapshot)

    def history(self):
        """The newest events of the history ring (GPUMEM_CONF history:N), as a dict ("gpumem-history")."""
        return json.loads(self.history_json())

    def history_json(self):
        """The same, as the library's JSON text (for writing to a file without parsing it)."""
        text = ctypes.c_void_p()
        _check(_library.gm_history_json(self._handle, ctypes.byref(text)))
        return _take_text(text)

    def summary(self):
        """The statistics as a table in the layout of torch.cuda.memory_summary()."""
        needed = ctypes.c_size_t()
        status = _library.gm_summary(self._handle, None, 0, ctypes.byref(needed))
        if status != _BUFFER_TOO_SMALL:
            _check(status)
        buffer = ctypes.create_string_buffer(needed.value)
        _check(_library.gm_summary(self._handle, buffer, needed.value, None))
        return buffer.value.decode()

    # ------------------------------------------------------------ memory pressure

    def set_pressure_policy(self, high=None, low=None, signals=("reserved", "allocated"), interval_ms=0,
                            psi_high=0.0, psi_low=0.0, host_root=None):
        """Watch memory: the level rises to "high" when a signal reaches `high` (a fraction of the memory limit,
        or of the device) and falls back to "normal" when every one is below `low` (default high - 0.1). Signals
        (a name or names): "reserved", "allocated", "device" (the driver's used memory), "host" (host memory
        used), "psi" (host memory stalls, against psi_high / psi_low percent), "cgroup" (this process's memory
        cgroup: its usage of the lower of memory.max and memory.high; never high without such a limit).
        interval_ms: how often the sampled signals are read (0: 100). host_root: where /proc and
        /sys/fs/cgroup are read (a fixture tree in tests). high=None turns the policy off."""
        if high is None:
            _check(_library.gm_set_pressure_policy(self._handle, None))
            return
        high, psi_high, psi_low = (_fraction(value, name) for value, name in
                                   ((high, "high"), (psi_high, "psi_high"), (psi_low, "psi_low")))
        if not 0 < high <= 1:
            raise ValueError(f"gpumem: set_pressure_policy(high={high:g}): high must be a fraction in (0, 1]")
        if low is None and high <= 0.1:
            raise ValueError(f"gpumem: set_pressure_policy(high={high:g}) leaves no room for the default low "
                             f"(high - 0.1): pass low= too, a fraction between 0 and {high:g}")
        policy = _pressure.PressurePolicy(
            high=high, low=high - 0.1 if low is None else _fraction(low, "low"), signals=_pressure.signal_bits(signals),
            interval_ms=_unsigned(interval_ms, "interval_ms", bits=32), psi_high=psi_high, psi_low=psi_low,
            host_root=_text(host_root or None, "host_root", none_allowed=True))  # "": the default, "/"
        _check(_library.gm_set_pressure_policy(self._handle, ctypes.byref(policy)))  # host_root is copied

    def pressure_policy(self):
        """The policy in force as a dict (with its defaults filled in), or None."""
        policy = _pressure.PressurePolicy()
        _check(_library.gm_get_pressure_policy(self._handle, ctypes.byref(policy)))
        if policy.high == 0:
            return None
        return {"high": policy.high, "low": policy.low, "signals": _pressure.signal_names(policy.signals),
                "interval_ms": policy.interval_ms, "psi_high": policy.psi_high, "psi_low": policy.psi_low,
                "host_root": policy.host_root.decode() if policy.host_root else None}

    def pressure(self):
        """The current level ("normal", "high", "critical") and the readings behind it, as a dict."""
        readings = _pressure.PressureReadings()
        _check(_library.gm_get_pressure(self._handle, ctypes.byref(readings)))
        return _pressure.readings_dict(readings)

    def check_pressure(self):
        """Read the sampled signals now and evaluate (callbacks run on this thread); the readings after."""
        readings = _pressure.PressureReadings()
        _check(_library.gm_check_pressure(self._handle, ctypes.byref(readings)))
        return _pressure.readings_dict(readings)

    def on_pressure(self, callback):
        """Call callback(level, readings) on every change of level ("high", "normal"; "critical" before the last
        retry of an allocation that would fail), with no gpumem lock held: it may allocate and free. Returns
        `callback`, for remove_pressure_callback. The registration belongs to the C allocator, not to this
        object (gpumem.pressure): it lasts until removed or until the allocator is closed, and a callback
        already registered with the allocator is refused, as gm_on_pressure refuses one twice."""
        if not callable(callback):
            raise TypeError(f"gpumem: on_pressure needs a callable, not {type(callback).__name__}")
        address = self.address
        thunk = _pressure_callbacks.reserve(address, callback)
        if thunk is None:
            raise GpumemError(1, "on_pressure: this callback is already registered with this allocator")
        status = _library.gm_on_pressure(self._handle, thunk, None)
        if status:
            _pressure_callbacks.cancel(address, thunk)
            _check(status)
        return callback

    def remove_pressure_callback(self, callback):
        """Stop calling `callback`; once this returns it runs nowhere (but on the thread calling this, when
        it is called from inside a callback)."""
        address = self.address
        thunk = _pressure_callbacks.find(address, callback)
        if thunk is None:
            raise GpumemError(1, "remove_pressure_callback: this callback is not registered with this allocator")
        _check(_library.gm_remove_pressure_callback(self._handle, thunk, None))
        _pressure_callbacks.release(address, thunk)

    def sim_set_used_elsewhere(self, size):
        """sim/host backends: make `size` bytes of the device used by "other processes"."""
        size = _unsigned(size, "size")
        _check(_library.gm_sim_set_used_elsewhere(self._handle, size))

    def device_info(self):
        info = _DeviceInfo()
        _check(_library.gm_get_device_info(self._handle, ctypes.byref(info)))
        return {"backend": info.backend.decode(), "name": info.name.decode(), "device": info.device,
                "device_count": info.device_count, "driver_version": info.driver_version,
                "total_bytes": info.total_bytes, "free_bytes": info.free_bytes,
                "virtual_memory": bool(info.virtual_memory), "granularity": info.granularity,
                "engine": info.engine.decode()}
