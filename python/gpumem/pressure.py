"""Memory pressure for gpumem.Allocator: gpumem.h's pressure types as ctypes structures, and the registry
that keeps each Python callback's C function alive for as long as the library may call it.

gm_on_pressure keeps a C function pointer. From Python that pointer is a ctypes thunk, freed when its
last Python reference goes, so the reference cannot live on the gpumem.Allocator object that registered
it: ``Allocator.attach(address)`` (and ``gpumem.torch.allocator()``) makes a new wrapper at every call,
and a thunk kept there would be freed with the wrapper while C still calls it. The registry here keeps
them by the C allocator's address instead, until ``remove_pressure_callback`` or the owning allocator's
``close()``. A thunk removed while a callback of its allocator is running (a callback may remove itself:
gpumem.h allows it) may still be on a stack, so it is kept until that allocator is destroyed.

As gm_on_pressure refuses a function already registered with the same context, a callback already
registered with an allocator is refused (GpumemError, invalid argument), whichever wrapper registers it.
"""
import ctypes
import threading

# gpumem.h's gm_pressure_level and GM_PRESSURE_SIGNAL_* bits, by name.
PRESSURE_LEVELS = ("normal", "high", "critical")
PRESSURE_SIGNALS = {"reserved": 1, "allocated": 2, "device": 4, "host": 8, "psi": 16, "cgroup": 32}


class PressurePolicy(ctypes.Structure):
    _fields_ = [("high", ctypes.c_double), ("low", ctypes.c_double), ("signals", ctypes.c_uint32),
                ("interval_ms", ctypes.c_uint32), ("psi_high", ctypes.c_double), ("psi_low", ctypes.c_double),
                ("host_root", ctypes.c_char_p)]


class PressureReadings(ctypes.Structure):
    _fields_ = [("level", ctypes.c_int), ("signals_high", ctypes.c_uint32), ("reserved_bytes", ctypes.c_uint64),
                ("allocated_bytes", ctypes.c_uint64), ("limit_bytes", ctypes.c_uint64),
                ("high_bytes", ctypes.c_uint64), ("low_bytes", ctypes.c_uint64),
                ("device_used_bytes", ctypes.c_uint64), ("device_total_bytes", ctypes.c_uint64),
                ("host_available_bytes", ctypes.c_int64), ("host_total_bytes", ctypes.c_int64),
                ("host_psi_avg10", ctypes.c_double), ("request_bytes", ctypes.c_uint64),
                ("released_bytes", ctypes.c_uint64), ("changes", ctypes.c_uint64),
                ("cgroup_current_bytes", ctypes.c_int64), ("cgroup_limit_bytes", ctypes.c_int64)]


# gm_pressure_callback: (allocator, level, readings, context).
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(PressureReadings), ctypes.c_void_p)


def signal_bits(names):
    """The bits of signal names (one name alone, or an iterable of them)."""
    if not isinstance(names, str) and not isinstance(names, (list, tuple, set, frozenset)):
        raise TypeError(f"pressure signals must be a name or a list of names, not {type(names).__name__}")
    bits = 0
    for name in (names,) if isinstance(names, str) else names:
        if name not in PRESSURE_SIGNALS:
            raise ValueError(f"unknown pressure signal {name!r} (known: {', '.join(PRESSURE_SIGNALS)})")
        bits |= PRESSURE_SIGNALS[name]
    return bits


def signal_names(bits):
    return tuple(name for name, bit in PRESSURE_SIGNALS.items() if bits & bit)


def level_name(level):
    return PRESSURE_LEVELS[level] if 0 <= level < len(PRESSURE_LEVELS) else "unknown"


def readings_dict(readings):
    result = {name: getattr(readings, name) for name, _ in PressureReadings._fields_}
    result["level"] = level_name(readings.level)
    result["signals_high"] = signal_names(readings.signals_high)
    return result


class _Registrations:
    """One C allocator's callbacks: [callback, thunk] pairs registered, thunks removed but perhaps still
    on a stack, and how many of its callbacks are running now."""

    def __init__(self):
        self.active = []
        self.retired = []
        self.running = 0

    def find(self, callback):
        return next((pair for pair in self.active if pair[0] is callback or pair[0] == callback), None)


class CallbackRegistry:
    """The thunks of every allocator's pressure callbacks, by the C allocator's address."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_allocator = {}

    def reserve(self, address, callback):
        """A new thunk calling `callback`, kept for `address`; None if `callback` is registered there already.
        The caller passes it to gm_on_pressure, and to cancel() if that fails."""
        with self._lock:
            registrations = self._by_allocator.setdefault(address, _Registrations())
            if registrations.find(callback) is not None:
                return None
            thunk = CALLBACK(self._trampoline(registrations, callback))
            registrations.active.append([callback, thunk])
            return thunk

    def _trampoline(self, registrations, callback):
        lock = self._lock

        def trampoline(allocator, level, readings, context):
            with lock:
                registrations.running += 1
            try:
                callback(level_name(level), readings_dict(readings.contents))
            finally:
                with lock:
                    registrations.running -= 1
        return trampoline

    def cancel(self, address, thunk):
        """gm_on_pressure refused `thunk`: C never held it."""
        with self._lock:
            registrations = self._by_allocator.get(address)
            if registrations is not None:
                registrations.active = [pair for pair in registrations.active if pair[1] is not thunk]

    def find(self, address, callback):
        """The thunk registered for `callback` at `address`, or None."""
        with self._lock:
            registrations = self._by_allocator.get(address)
            pair = registrations.find(callback) if registrations is not None else None
            return pair[1] if pair is not None else None

    def release(self, address, thunk):
        """gm_remove_pressure_callback removed `thunk`: drop it, unless a callback of the allocator is
        running (it may be this one, removing itself), in which case it is kept until the allocator goes."""
        with self._lock:
            registrations = self._by_allocator.get(address)
            if registrations is None:
                return
            registrations.active = [pair for pair in registrations.active if pair[1] is not thunk]
            if registrations.running:
                registrations.retired.append(thunk)

    def forget(self, address):
        """The allocator at `address` was destroyed: C holds none of its thunks any more."""
        with self._lock:
            self._by_allocator.pop(address, None)
