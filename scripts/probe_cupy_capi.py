import cupy, importlib
for name in ("cupy.cuda.stream", "cupy.cuda.device", "cupy.cuda.memory_hook", "cupy.cuda.memory", "cupy.cuda.runtime", "cupy_backends.cuda.api.runtime", "cupy.cuda.pinned_memory", "cupy._core.core"):
    try:
        module = importlib.import_module(name)
    except Exception as error:
        print(name, "import error", error); continue
    capi = getattr(module, "__pyx_capi__", None)
    if capi is None:
        print(name, "no __pyx_capi__"); continue
    import ctypes
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    for key, capsule in sorted(capi.items()):
        if any(word in key for word in ("stream", "device", "hook", "Memory", "get_", "alloc", "malloc")):
            print(name, key, get_name(capsule))
print(cupy.__version__)
try:
    import Cython; print("cython", Cython.__version__)
except ImportError:
    print("no Cython")
