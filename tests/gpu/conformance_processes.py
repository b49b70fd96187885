"""The other processes of test_torch_conformance.py's CUDA IPC checks, in a module of their own so that
the processes torch.multiprocessing spawns import them by name: a tensor sent to another process,
which adds one to it on a side stream; a tensor received from another process, which checks the writes
that reached it; a fresh process that sends its first tensor; a parent that its child may not trace. Each runs under gpumem or, with
`native_child`, under PyTorch's own allocator (optionally with expandable segments)."""
import os


def add_one_in_another_process(queue, answers):
    """The other process of cuda_tensors_shared_with_another_process: the sum of what it received, then
    one added to every element in place."""
    import torch
    try:
        tensor = queue.get(timeout=60)
        total = float(tensor.sum().item())
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            tensor.add_(1)
        tensor.record_stream(side)  # memory of the other process: the allocator leaves it alone
        side.synchronize()
        torch.cuda.synchronize()
        del tensor
        answers.put(("ok", total))
    except Exception as error:  # noqa: BLE001 -- reported to the parent
        answers.put(("error", f"{type(error).__name__}: {error}"[:400]))


class ChildEnvironment:
    """os.environ for the processes started inside the block: without gpumem (PyTorch's own allocator,
    with `alloc_conf` as PYTORCH_CUDA_ALLOC_CONF) when `native`, else inherited as it is."""

    def __init__(self, native, alloc_conf=None):
        self.changes = {"GPUMEM_TORCH": None, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if native else {}

    def __enter__(self):
        self.saved = {key: os.environ.get(key) for key in self.changes}
        for key, value in self.changes.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)

    def __exit__(self, *_):
        for key, value in self.saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def _send_a_view(torch, target, native_child=False):
    """A view of a CUDA tensor goes to a new process running `target`, which answers with the view's sum
    and adds one to it: the whole tensor, the view's sum here and there, and whether the adds reached it."""
    import queue as queues
    context = torch.multiprocessing.get_context("spawn")
    tensors, answers = context.Queue(), context.Queue()
    process = context.Process(target=target, args=(tensors, answers))
    with ChildEnvironment(native_child):
        process.start()
    try:
        tensor = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
        view = tensor[1000:]
        expected = float(view.sum().item())
        tensors.put(view)
        try:
            status, value = answers.get(timeout=90)
        except queues.Empty:
            raise AssertionError("the other process never answered") from None
        assert status == "ok", value
        process.join(timeout=60)
        added = torch.equal(view.cpu(), torch.arange(1000, 1 << 22, dtype=torch.float32) + 1)
        return tensor, expected, value, added
    finally:
        if process.is_alive():
            process.kill()


def send_to_another_process(torch, native_child):
    """A view of a CUDA tensor goes to another process (CUDA IPC), which reads it and writes into the
    same memory on a side stream, recording that stream on it."""
    tensor, expected, value, added = _send_a_view(torch, add_one_in_another_process, native_child)
    assert value == expected, (value, expected)
    assert added
    assert tensor[999].item() == 999


def share_with_the_parent(tensors, answers):
    """The other process of receive_from_another_process: shares a tensor, keeps it until the parent
    is done with it, then reports whether the parent's writes reached it."""
    import torch
    try:
        keep = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # the tensor is not at its segment's start
        tensor = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
        tensors.put(tensor[7:])
        assert answers.get(timeout=90) == "done"
        expected = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
        expected[7:] *= 2
        tensors.put(("ok", bool(torch.equal(tensor, expected))))
        del keep
    except Exception as error:  # noqa: BLE001 -- reported to the parent
        tensors.put(("error", f"{type(error).__name__}: {error}"[:400]))


def receive_from_another_process(torch, native_child, alloc_conf=None):
    import queue as queues
    context = torch.multiprocessing.get_context("spawn")
    tensors, answers = context.Queue(), context.Queue()
    process = context.Process(target=share_with_the_parent, args=(tensors, answers))
    with ChildEnvironment(native_child, alloc_conf):
        process.start()
    try:
        try:
            received = tensors.get(timeout=90)
        except queues.Empty:
            raise AssertionError("the other process sent nothing") from None
        assert torch.is_tensor(received), received
        assert torch.equal(received.cpu(), torch.arange(7, 1 << 22, dtype=torch.float32))
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            received.mul_(2)
        received.record_stream(side)
        side.synchronize()
        del received
        answers.put("done")
        status, value = tensors.get(timeout=90)
        assert status == "ok" and value is True, (status, value)
        process.join(timeout=60)
    finally:
        if process.is_alive():
            process.kill()


def send_from_a_fresh_process(answers):
    import torch
    try:
        send_to_another_process(torch, native_child=True)
        answers.put(("ok", None))
    except Exception as error:  # noqa: BLE001 -- reported to the parent
        answers.put(("error", f"{type(error).__name__}: {error}"[:400]))


def _drop_the_right_to_trace():
    """Take CAP_SYS_PTRACE out of this process's capabilities (capset), as a process of an ordinary user
    has none: with its parent not dumpable, pidfd_getfd on the parent is then refused."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= ~(1 << 19)  # CAP_SYS_PTRACE
    data[0].permitted &= ~(1 << 19)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def add_one_without_the_right_to_trace(queue, answers):
    """add_one_in_another_process, in a child that may not trace its parent (what Yama's ptrace_scope 1
    makes of every child)."""
    try:
        _drop_the_right_to_trace()
    except OSError as error:
        answers.put(("error", f"cannot drop CAP_SYS_PTRACE: {error}"))
        return
    add_one_in_another_process(queue, answers)


def send_to_a_child_that_may_not_trace():
    """Run as a program of its own (it makes itself not dumpable): a view of a CUDA tensor goes to a
    child without the right to trace it, which adds one to it. Prints OK and the child's sum."""
    import ctypes
    import torch
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
    _, _, value, added = _send_a_view(torch, add_one_without_the_right_to_trace)
    print("SHARED", value, added, flush=True)
