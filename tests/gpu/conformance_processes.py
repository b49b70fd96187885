"""The other processes of test_torch_conformance.py's CUDA IPC checks, in a module of their own so that
the processes torch.multiprocessing spawns import them by name: a tensor sent to another process,
which adds one to it on a side stream; a tensor received from another process, which checks the writes
that reached it; a fresh process that sends its first tensor. Each runs under gpumem or, with
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


def send_to_another_process(torch, native_child):
    """A view of a CUDA tensor goes to another process (CUDA IPC), which reads it and writes into the
    same memory on a side stream, recording that stream on it."""
    import queue as queues
    context = torch.multiprocessing.get_context("spawn")
    tensors, answers = context.Queue(), context.Queue()
    process = context.Process(target=add_one_in_another_process, args=(tensors, answers))
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
        assert value == expected, (value, expected)
        process.join(timeout=60)
        assert torch.equal(view.cpu(), torch.arange(1000, 1 << 22, dtype=torch.float32) + 1)
        assert tensor[999].item() == 999
    finally:
        if process.is_alive():
            process.kill()


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
