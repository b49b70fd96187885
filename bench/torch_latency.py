"""Time per allocation and free through PyTorch, per allocation pattern, under each allocator; prints a table.

    python3 bench/torch_latency.py [--allocators torch-native,torch-expandable,cuda-async,gpumem,null]
                                   [--patterns same,alternating,cycling,small,ascending,streams]
                                   [--iterations 2000] [--rounds 15] [--repeats 3] [--cpu N] [--out results.jsonl]
                                   [--baseline-library OTHER/libgpumem.so]

The machine's speed drifts: run one allocator's process after another's and whole processes land in a
fast or a slow period, by more than the allocators differ. So the allocators run side by side and take
turns: each repeat starts one process per allocator, all on the same CPU (--cpu; default the second
one allowed; only the process whose turn it is runs), and for each pattern, after a warm-up round each,
they take --rounds turns in rotation. In a turn a process times its loop of `x = torch.empty(n,
dtype=torch.uint8, device="cuda"); del x` over --iterations sizes, the same loop on CPU tensors of 1
byte (what Python and the dispatcher cost without any allocator work), and the same sizes in C++
straight through the allocator interface PyTorch calls (bench/allocator_interface_loop.cpp, compiled
at start: allocate and the deleter, nothing else). "allocator µs" is the CUDA loop's time per
iteration less the CPU loop's; it still holds what a CUDA tensor costs beyond a CPU one (see `empty`).
"interface µs" is the C++ loop's time per iteration: the allocator's own time. "stirred µs" (patterns
same, alternating, cycling, small, empty) is the same C++ loop with the first-level caches swept after
every call (64 KiB of data read, 40 KiB of code run), less the sweeps alone: the allocator's own time
when, as in an interpreter's loop, little of it stays cached between calls. A repeat's figure
for an allocator is the median of its turns; the table gives the median over repeats and the spread
(max - min) of the repeats' figures, and the ratios of each allocator's medians to torch-native's, of
the whole loop, of the allocator µs and of the interface µs.

The `null` contender is an allocator that does no allocator work (bench/null_allocator.cpp: it asks the
current device and returns one buffer made once; its deleter does nothing), installed as gpumem's adapter
is. Its "allocator µs" is the floor under every allocator's figure for each pattern's own sizes (what a
CUDA tensor of those sizes costs beyond a CPU one without an allocator), which `empty` only shows for
0-byte tensors. "less null's": an allocator's figure less the null allocator's of the same round, and
its ratio to torch-native's the median over rounds of those paired differences' ratios.

--baseline-library adds the contender `gpumem-baseline`: gpumem's adapter over another build's libgpumem
(the last commit's, say), its extension compiled apart, taking turns with the others: what a change to
the library does through PyTorch, measured side by side rather than across runs the machine drifts
between.

Patterns (sizes in bytes):
  same         4 MiB, every time
  alternating  1 MiB and 64 MiB in turn (a page move per pair in a naive VMM allocator)
  cycling      512, 4 KiB, 64 KiB, 1 MiB, 3 MiB, 17 MiB, 64 MiB in turn
  small        64 B to 64 KiB, pseudo-random
  ascending    a list of tensors that grows by 1 MiB each, freed in one go every 64
  streams      4 MiB allocated on one of four streams, freed after use on another (record_stream)
  empty        0 bytes: a CUDA tensor that needs no memory (the allocator returns at once), so its
               "allocator µs" is what a CUDA tensor costs beyond a CPU one with no allocator work: the
               floor under every allocator's figure
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
ALLOCATORS = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cuda-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "gpumem": {"GPUMEM_TORCH": "1"},
    "null": {"GPUMEM_BENCH_NULL_ALLOCATOR": "1"},
}
PATTERNS = ("same", "alternating", "cycling", "small", "ascending", "streams", "empty")
STIRRED_PATTERNS = ("same", "alternating", "cycling", "small", "empty")


def sizes_of(pattern, iterations):
    if pattern == "empty":
        return [0] * iterations
    if pattern == "same":
        return [4 * MIB] * iterations
    if pattern == "alternating":
        return [MIB if i % 2 == 0 else 64 * MIB for i in range(iterations)]
    if pattern == "cycling":
        cycle = [512, 4096, 65536, MIB, 3 * MIB, 17 * MIB, 64 * MIB]
        return [cycle[i % len(cycle)] for i in range(iterations)]
    if pattern == "small":
        state, sizes = 12345, []
        for _ in range(iterations):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            sizes.append(64 << (state >> 61) % 11)  # 64 B .. 64 KiB
        return sizes
    return [MIB * (1 + i % 64) for i in range(iterations)]  # ascending, streams: unused sizes


def time_loop(torch, pattern, sizes, device):
    """Seconds for the pattern's loop over `sizes` on `device` ("cuda" or "cpu")."""
    if device == "cpu":
        sizes = [1] * len(sizes)
    if pattern == "ascending":
        started = time.perf_counter()
        held = []
        for i in range(len(sizes)):
            held.append(torch.empty(MIB * (1 + i % 64) if device == "cuda" else 1, dtype=torch.uint8, device=device))
            if len(held) == 64:
                held.clear()
        held.clear()
        return time.perf_counter() - started
    if pattern == "streams" and device == "cuda":
        streams = [torch.cuda.Stream() for _ in range(4)]
        started = time.perf_counter()
        for i in range(len(sizes)):
            with torch.cuda.stream(streams[i % 4]):
                x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
            x.record_stream(streams[(i + 1) % 4])
            del x
        return time.perf_counter() - started
    started = time.perf_counter()
    for size in sizes:
        x = torch.empty(size, dtype=torch.uint8, device=device)
        del x
    return time.perf_counter() - started


def bench_extension(name, source):
    """bench/SOURCE compiled as a torch extension (once; the processes share the build)."""
    from torch.utils.cpp_extension import load
    return load(name=name, sources=[os.path.join(ROOT, "bench", source)], extra_cflags=["-O2"], with_cuda=True,
                verbose=False)


def install_null_allocator():
    """bench/null_allocator.cpp, installed as PyTorch's CUDA allocator (before CUDA starts)."""
    bench_extension("gpumem_bench_null_allocator", "null_allocator.cpp").install()


def interface_loop():
    """bench/allocator_interface_loop.cpp."""
    return bench_extension("gpumem_allocator_interface_loop", "allocator_interface_loop.cpp")


def child(arguments):
    """One allocator's process: a command per line on stdin ("PATTERN" times one turn, "quit" ends), one
    JSON line per turn on stdout."""
    if arguments.cpu is not None:
        os.sched_setaffinity(0, {arguments.cpu})
    import torch
    if os.environ.get("GPUMEM_BENCH_NULL_ALLOCATOR"):
        install_null_allocator()
    torch.cuda.init()
    try:
        loop = interface_loop()
    except Exception as error:  # no compiler or headers: the table leaves the interface columns empty
        print(f"torch_latency: cannot build bench/allocator_interface_loop.cpp: {error}", file=sys.stderr)
        loop = None
    print("READY", flush=True)
    for line in sys.stdin:
        pattern = line.strip()
        if pattern == "quit":
            break
        sizes = sizes_of(pattern, arguments.iterations)
        torch.cuda.synchronize()
        cuda = time_loop(torch, pattern, sizes, "cuda")
        torch.cuda.synchronize()
        cpu = time_loop(torch, pattern, sizes, "cpu")
        result = {"us": cuda / len(sizes) * 1e6, "cpu_us": cpu / len(sizes) * 1e6}
        if loop:
            torch.cuda.synchronize()
            result["interface_us"] = loop.time_pattern(pattern, sizes) / len(sizes) * 1e6
            if pattern in STIRRED_PATTERNS:
                result["stirred_us"] = loop.time_stirred(sizes) / len(sizes) * 1e6
        print(json.dumps(result), flush=True)


class Contender:
    """A running child process of one allocator."""

    def __init__(self, allocator, arguments):
        environment = dict(os.environ, **ALLOCATORS[allocator])
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"),
                                                                  os.environ.get("PYTHONPATH")]))
        if allocator == "gpumem-baseline":
            environment.update(GPUMEM_TORCH="1", GPUMEM_LIBRARY=arguments.baseline_library,
                               TORCH_EXTENSIONS_DIR=baseline_extensions_folder())
        elif allocator != "gpumem":
            environment.pop("GPUMEM_TORCH", None)
        if allocator != "null":
            environment.pop("GPUMEM_BENCH_NULL_ALLOCATOR", None)
        command = [sys.executable, os.path.abspath(__file__), "--child", "--iterations", str(arguments.iterations),
                   "--cpu", str(arguments.cpu)]
        self.allocator = allocator
        self.process = subprocess.Popen(command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self._expect("READY")

    def _expect(self, what):
        line = self.process.stdout.readline()
        if not line.startswith(what):
            self.process.kill()
            raise RuntimeError(f"{self.allocator}: expected {what}, got {line!r} (exit status {self.process.wait()})")
        return line

    def turn(self, pattern):
        self.process.stdin.write(pattern + "\n")
        self.process.stdin.flush()
        return json.loads(self._expect("{"))

    def close(self):
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self.process.wait(timeout=60)


def baseline_extensions_folder():
    """Where the baseline's adapter is compiled: apart from the other gpumem's, which links another library
    (in one folder, each would rebuild over the other whenever a process starts)."""
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpumem-baseline-extensions-{os.getuid()}")


def one_repeat(allocators, arguments):
    """{allocator: {pattern: {"us": [per turn], "cpu_us": [per turn]}}} of one set of processes."""
    contenders = [Contender(name, arguments) for name in allocators]
    turns = {name: {} for name in allocators}
    try:
        for pattern in arguments.patterns.split(","):
            for contender in contenders:
                contender.turn(pattern)  # warm-up: the cache fills, the code is loaded
                turns[contender.allocator][pattern] = {"us": [], "cpu_us": [], "interface_us": [], "stirred_us": []}
            for round_number in range(arguments.rounds):
                shift = round_number % len(contenders)
                for contender in contenders[shift:] + contenders[:shift]:
                    result = contender.turn(pattern)
                    for key in ("us", "cpu_us", "interface_us", "stirred_us"):
                        if key in result:
                            turns[contender.allocator][pattern][key].append(result[key])
    finally:
        for contender in contenders:
            contender.close()
    return turns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--iterations", type=int, default=2000, help="allocations per turn")
    parser.add_argument("--rounds", type=int, default=15, help="turns of each allocator per pattern and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="fresh sets of processes")
    parser.add_argument("--cpu", type=int, help="the CPU every process runs on (default: the second one allowed)")
    parser.add_argument("--out")
    parser.add_argument("--baseline-library", metavar="LIBGPUMEM",
                        help="another build's libgpumem.so, run as the contender gpumem-baseline")
    parser.add_argument("--render", metavar="RESULTS.jsonl", help="print the table of an earlier run's --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return child(arguments)
    if arguments.render:
        with open(arguments.render) as results:
            return print_table([json.loads(line) for line in results if line.strip()])
    allowed = sorted(os.sched_getaffinity(0))
    if arguments.cpu is None:
        arguments.cpu = allowed[1] if len(allowed) > 1 else allowed[0]
    elif arguments.cpu not in allowed:
        parser.error(f"--cpu {arguments.cpu} is not one this process may run on ({allowed})")
    allocators = arguments.allocators.split(",")
    if "gpumem-baseline" in allocators and not arguments.baseline_library:
        parser.error("gpumem-baseline runs another build's library: give it with --baseline-library")
    if arguments.baseline_library:
        if not os.path.isfile(arguments.baseline_library):
            parser.error(f"--baseline-library {arguments.baseline_library}: no such file")
        arguments.baseline_library = os.path.abspath(arguments.baseline_library)
        if "gpumem-baseline" not in allocators:
            allocators.append("gpumem-baseline")
        ALLOCATORS["gpumem-baseline"] = {}
    unknown = [name for name in allocators if name not in ALLOCATORS]
    if unknown:
        parser.error(f"unknown allocator(s) {', '.join(unknown)}; known: {', '.join(ALLOCATORS)}")
    if arguments.repeats < 1:
        parser.error(f"--repeats {arguments.repeats}: at least 1")
    patterns = arguments.patterns.split(",")
    unknown = [name for name in patterns if name not in PATTERNS]
    if unknown:
        parser.error(f"unknown pattern(s) {', '.join(unknown)}; known: {', '.join(PATTERNS)}")
    repeats = []
    for _ in range(arguments.repeats):
        repeats.append(one_repeat(allocators, arguments))
        records = [{"pattern": pattern, "allocator": name, "turns": [repeat[name][pattern] for repeat in repeats]}
                   for pattern in patterns for name in allocators]
        if arguments.out:  # after every repeat: a run stopped early leaves the repeats it finished (--render)
            with open(arguments.out, "w") as out:
                for record in records:
                    out.write(json.dumps(record) + "\n")
    print_table(records)


def paired_ratio(turns, native_turns, key):
    """The median over rounds of this allocator's figure over torch-native's in the same round (the
    machine's drift cancels within a round)."""
    ratios = []
    for mine, theirs in zip(turns, native_turns):
        for index in range(min(len(mine["us"]), len(theirs["us"]))):
            ratios.append(key(mine, index) / key(theirs, index))
    return statistics.median(ratios)


def print_table(records):
    """The table of the module's docstring from the records (`--out`'s lines)."""
    def whole(turns, index):
        return turns["us"][index]

    def own(turns, index):
        return turns["us"][index] - turns["cpu_us"][index]

    def interface(turns, index):
        return turns["interface_us"][index]

    by_key = {(record["pattern"], record["allocator"]): record["turns"] for record in records}
    allocators = list(dict.fromkeys(record["allocator"] for record in records))
    patterns = list(dict.fromkeys(record["pattern"] for record in records))

    def median_of(pattern, name, key):
        return statistics.median(key(turns, index) for turns in by_key[(pattern, name)]
                                 for index in range(len(turns["us"])))

    has_null = any(name == "null" for (_, name) in by_key)
    print("| pattern | allocator | µs per alloc+free (median) | spread of repeats | allocator µs (less the CPU loop) "
          "| allocator µs less `empty`'s | interface µs | ratio to torch-native | allocator µs ratio | ratio less `empty` "
          "| interface µs ratio |" + (" allocator µs less null's | ratio less null |" if has_null else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if has_null else ""))
    for pattern in patterns:
        for name in allocators:
            turns = by_key[(pattern, name)]
            repeat_medians = [statistics.median(t["us"]) for t in turns]
            floor = median_of("empty", name, own) if ("empty", name) in by_key else None
            mine_own = median_of(pattern, name, own)
            beyond = f"{mine_own - floor:.2f}" if floor is not None and pattern != "empty" else ""
            has_interface = all(t.get("interface_us") for t in turns)
            interface_cell = f"{median_of(pattern, name, interface):.3f}" if has_interface else ""
            cells = ["", "", "", ""]
            if name != "torch-native" and (pattern, "torch-native") in by_key:
                native = by_key[(pattern, "torch-native")]
                cells[0] = f"{paired_ratio(turns, native, whole):.2f}"
                cells[1] = f"{paired_ratio(turns, native, own):.2f}"
                if beyond and ("empty", "torch-native") in by_key:
                    native_beyond = median_of(pattern, "torch-native", own) - median_of("empty", "torch-native", own)
                    cells[2] = f"{(mine_own - floor) / native_beyond:.2f}"
                if has_interface and all(t.get("interface_us") for t in native):
                    cells[3] = f"{paired_ratio(turns, native, interface):.2f}"
            if has_null:
                cells += null_cells(by_key, pattern, name, own)
            print(f"| {pattern} | {name} | {median_of(pattern, name, whole):.2f} | "
                  f"{max(repeat_medians) - min(repeat_medians):.2f} | {mine_own:.2f} | {beyond} | {interface_cell} | "
                  + " | ".join(cells) + " |")
    print_stirred_table(by_key, allocators, patterns)


def null_cells(by_key, pattern, name, own):
    """The allocator µs less the null allocator's of the same round (median), and the median over rounds
    of that difference's ratio to torch-native's; empty cells where a run lacks either."""
    if name == "null" or (pattern, "null") not in by_key:
        return ["", ""]
    null = by_key[(pattern, "null")]

    def beyond_null(turns):
        return [own(mine, index) - own(floor, index) for mine, floor in zip(turns, null)
                for index in range(min(len(mine["us"]), len(floor["us"])))]

    mine = beyond_null(by_key[(pattern, name)])
    ratio = ""
    if name != "torch-native" and (pattern, "torch-native") in by_key:
        native = beyond_null(by_key[(pattern, "torch-native")])
        ratio = f"{statistics.median(m / n for m, n in zip(mine, native)):.2f}"
    return [f"{statistics.median(mine):.2f}", ratio]


def print_stirred_table(by_key, allocators, patterns):
    """The interface loop with the caches swept between calls: median µs and the paired ratio."""
    def stirred(turns, index):
        return turns["stirred_us"][index]

    rows = [(pattern, name) for pattern in patterns for name in allocators
            if all(t.get("stirred_us") for t in by_key[(pattern, name)])]
    if not rows:
        return
    print()
    print("| pattern | allocator | stirred µs (interface, caches swept between calls) | spread of repeats "
          "| ratio to torch-native |")
    print("|---|---|---|---|---|")
    for pattern, name in rows:
        turns = by_key[(pattern, name)]
        values = [v for t in turns for v in t["stirred_us"]]
        repeat_medians = [statistics.median(t["stirred_us"]) for t in turns]
        ratio = ""
        if name != "torch-native" and (pattern, "torch-native") in rows:
            ratio = f"{paired_ratio(turns, by_key[(pattern, 'torch-native')], stirred):.2f}"
        print(f"| {pattern} | {name} | {statistics.median(values):.3f} | "
              f"{max(repeat_medians) - min(repeat_medians):.3f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
