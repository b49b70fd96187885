"""A stand-in for PyTorch, for tests that run bench/more_workloads.py and bench/record_traces.py as
processes on a machine with no GPU and no PyTorch (put this folder first on PYTHONPATH).

Tensors are shapes. Each tensor made is an allocation in the memory history (4 bytes an element, at
least 512), a step's tensors are freed when the optimizer drops the gradients; the parameters stay.
The caching allocator's statistics follow what the replay extension (torch.utils.cpp_extension) does.
Every call a test checks is appended to the file FAKE_TORCH_LOG names, one JSON line [pid, call, ...].

FAKE_TORCH_CRASH=KIND: the model of that kind (vit, convnext, llama, unet) fails its forward pass.
manual_seed(S) allocates one tensor of 1000000 + S bytes, so that a trace shows its seed (see
utils/cpp_extension.py's FAKE_TORCH_OOM_SIZE).
"""
import contextlib
import json
import math
import os
import types

__version__ = "0.0-fake"
bfloat16 = "bfloat16"
MiB = 2**20
state = {"history": False, "events": [], "next_address": 0, "step_tensors": [], "allocated": 0,
         "allocated_peak": 0, "reserved": 0, "reserved_peak": 0, "device_allocations": 0, "autocast": None}


def log(*record):
    path = os.environ.get("FAKE_TORCH_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps([os.getpid(), *record]) + "\n")


class OutOfMemoryError(RuntimeError):
    pass


class Tensor:
    def __init__(self, shape, step=True, size=None):
        self.shape = tuple(shape)
        self.size = size or max(512, 4 * math.prod(self.shape))
        self.address = state["next_address"]
        state["next_address"] += 1
        state["allocated"] += self.size
        state["allocated_peak"] = max(state["allocated_peak"], state["allocated"])
        state["reserved"] = max(state["reserved"], state["allocated"])
        state["reserved_peak"] = max(state["reserved_peak"], state["reserved"])
        if state["history"]:
            state["events"].append({"action": "alloc", "addr": self.address, "size": self.size, "stream": 0})
        if step:
            state["step_tensors"].append(self)

    def free(self):
        state["allocated"] -= self.size
        if state["history"]:
            state["events"].append({"action": "free_requested", "addr": self.address, "size": self.size, "stream": 0})

    def __add__(self, other):
        return Tensor(self.shape)

    def float(self):
        return Tensor(self.shape)

    def detach(self):
        return self

    def item(self):
        return 0.0

    def backward(self):
        log("backward")


class FakeModel:
    """What torchvision, transformers and diffusers build here: KIND's parameters; a call returns OUTPUT(input)."""

    def __init__(self, kind, output):
        self.kind, self.output = kind, output
        self.weights = Tensor((MiB,), step=False)

    def to(self, *args, **kwargs):
        return self

    def parameters(self):
        return [self.weights]

    def __call__(self, *inputs, **named):
        first = inputs[0] if inputs else next(iter(named.values()))
        log("forward", self.kind, list(first.shape), state["autocast"])
        if os.environ.get("FAKE_TORCH_CRASH") == self.kind:
            raise RuntimeError(f"fake crash in {self.kind}'s forward pass")
        Tensor(first.shape + (2,))  # activations
        return self.output(first)


def manual_seed(seed):
    log("manual_seed", seed)
    Tensor((1,), step=False, size=1000000 + seed)


def device(name):
    return name


def randn(*size, device=None):
    log("randn", list(size))
    return Tensor(size)


def randint(low, high, size, device=None):
    log("randint", [low, high], list(size))
    return Tensor(size)


def empty(*size, device=None):
    log("empty", list(size))
    state["reserved"] = max(state["reserved"], 2 * MiB)
    state["reserved_peak"] = max(state["reserved_peak"], state["reserved"])


class Ops:
    """torch.tensor of anchor_replay.load_ops' rows (kind, id, size)."""

    def __init__(self, rows):
        self.rows = list(rows)
        self.shape = (len(self.rows), 3)

    def __getitem__(self, key):
        column = [row[key[1]] for row in self.rows]
        return types.SimpleNamespace(max=lambda: max(column))


def tensor(rows):
    return Ops(rows)


@contextlib.contextmanager
def autocast(device_type, dtype=None):
    state["autocast"] = [device_type, dtype]
    try:
        yield
    finally:
        state["autocast"] = None


class AdamW:
    def __init__(self, parameters, lr=None):
        self.parameters = list(parameters)

    def step(self):
        log("optimizer_step")

    def zero_grad(self, set_to_none=True):
        log("zero_grad", set_to_none)
        for t in state["step_tensors"]:
            t.free()
        state["step_tensors"].clear()


optim = types.SimpleNamespace(AdamW=AdamW)
nn = types.SimpleNamespace(functional=types.SimpleNamespace(cross_entropy=lambda out, target: Tensor(()),
                                                            mse_loss=lambda out, target: Tensor(())))


def _record_memory_history(enabled="all", **options):
    log("record_memory_history", enabled, options)
    state["history"] = enabled is not None


def _snapshot():
    return {"device_traces": [list(state["events"])]}


def memory_stats():
    return {"allocated_bytes.all.peak": state["allocated_peak"], "reserved_bytes.all.peak": state["reserved_peak"],
            "reserved_bytes.all.current": state["reserved"], "num_device_alloc": state["device_allocations"],
            "num_alloc_retries": 0}


def max_memory_allocated():
    return state["allocated_peak"]


def max_memory_reserved():
    return state["reserved_peak"]


def empty_cache():
    log("empty_cache")
    state["reserved"] = state["allocated"]


def reset_peak_memory_stats():
    log("reset_peak_memory_stats")
    state["reserved_peak"], state["allocated_peak"] = state["reserved"], state["allocated"]


cuda = types.SimpleNamespace(
    init=lambda: log("cuda_init"), synchronize=lambda: None, get_device_name=lambda: "Fake GPU",
    mem_get_info=lambda: (100 << 30, 141 << 30), memory_stats=memory_stats, empty_cache=empty_cache,
    reset_peak_memory_stats=reset_peak_memory_stats, max_memory_allocated=max_memory_allocated,
    max_memory_reserved=max_memory_reserved,
    memory=types.SimpleNamespace(_record_memory_history=_record_memory_history, _snapshot=_snapshot))
