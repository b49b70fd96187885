"""Record allocation traces of bench/more_workloads.py's workloads on the GPU and replay each through
PyTorch's allocators and cudaMallocAsync, as the anchors (../shared/anchors) did for the shared traces.

    python3 bench/record_traces.py --out DIR [--workloads vit,convnext,llama_varlen,unet] [--seeds 0,1]
                                   [--steps 4] [--warmup 2] [--jobs 4] [--deadline 480]

1. Each workload x seed is recorded by its own process (bench/more_workloads.py W --seed S --trace ...),
   JOBS at a time (a process's memory history holds its own allocations only, so recordings side by side
   give the traces they would give alone), and its trace gzipped into DIR as W-seedS.csv.gz, the format
   of ../shared/traces. Meanwhile a process compiles the replay extension.
2. Each trace is replayed under each allocator as ../shared/anchors/replay.py (its copy,
   bench/anchor_replay.py, whose C++ loop and trace reader are used as they are) measures it:
   torch-native (no PYTORCH_CUDA_ALLOC_CONF), torch-expandable (expandable_segments:True), cuda-async
   (cudaMallocAsync on the default pool, release threshold UINT64_MAX). One process per allocator loads
   the extension once and replays the traces in turn, each from the state a fresh process has: the async
   pool trimmed to nothing; PyTorch's cache emptied, one small tensor made and dropped (as replay.py's
   main does), the peak statistics reset. After a failed replay the rest go on in a fresh process.
3. DIR/anchors.json holds per trace what ../shared/anchors/anchors.json's "traces" entries hold
   (peak_live_MiB, ops, replay: {allocator: {peak_reserved_MiB, ratio, ns_per_op}}), the recording's
   JSON line, and the message of anything that failed. The Markdown table goes to stdout and DIR/table.md,
   progress to stderr, each recording's output to DIR/logs.

Every failure (a recording or a replay that crashed, ran out of memory or past --deadline, seconds for
the whole run) is in the table and the JSON with its message and makes the exit status 1. A workload
unavailable here (torchvision or transformers not installed) is reported as unavailable: never a pass, and not
a failure. bench/more_traces_table.py adds gpumem's ratio and the target (run where gpumem is built).
"""
import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

BENCH = os.path.dirname(os.path.abspath(__file__))
MORE_WORKLOADS = os.path.join(BENCH, "more_workloads.py")
WORKLOADS = ("vit", "convnext", "llama_varlen", "unet")
UNAVAILABLE_STATUS = 4  # more_workloads.py's exit status for an unavailable workload
ALLOCATORS = {  # name: (anchor_replay's mode, PYTORCH_CUDA_ALLOC_CONF, description as in anchors.json)
    "torch-native": (0, None, "PyTorch caching allocator, default settings"),
    "torch-expandable": (0, "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "cuda-async": (1, None, "cudaMallocAsync on the default pool, release threshold UINT64_MAX"),
}
COMPILE = "compile"  # the worker that only builds the extension
MiB = 2**20

EXTENSION = "more_traces_replay"
# Added to anchor_replay.SRC: replay() leaves its memory cached in the default pool (release threshold
# UINT64_MAX), which a fresh process would not have.
TRIM_SOURCE = r"""
// Gives the default pool's unused memory back; returns the bytes it still reserves.
double trim_async_pool() {
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  cudaDeviceSynchronize();
  cudaMemPoolTrimTo(pool, 0);
  uint64_t reserved = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  return (double)reserved;
}
"""


def trace_name(path):
    return os.path.basename(path).split(".")[0]


def last_line(text):
    """The last non-empty line of a process's output: a Python traceback's exception line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def json_lines(text):
    results = []
    for line in (text or "").splitlines():
        if line.startswith("{"):
            try:
                results.append(json.loads(line))
            except ValueError:
                pass
    return results


# --- the replay worker (runs on the GPU machine, in a process of its own per allocator) ---

def load_extension():
    import anchor_replay
    from torch.utils.cpp_extension import load_inline
    return load_inline(EXTENSION, cpp_sources=anchor_replay.SRC + TRIM_SOURCE, functions=["replay", "trim_async_pool"],
                       with_cuda=True, extra_cflags=["-O2"], verbose=False)


def replay_worker(allocator, traces):
    """Replays TRACES (plain .csv) in turn; one JSON line per trace. On an error: its line, exit status 3."""
    import torch
    import anchor_replay
    ext = load_extension()
    if allocator == COMPILE:
        return 0
    mode = ALLOCATORS[allocator][0]
    torch.cuda.init()
    for path in traces:
        try:
            ops, nslots = anchor_replay.load_ops(path, 0)
            left = ext.trim_async_pool() if mode == 1 else 0.0
            torch.cuda.empty_cache()
            torch.empty(1, device="cuda")
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_stats().get("reserved_bytes.all.current", 0)
            ns, rh, maxlive, fails = ext.replay(ops, nslots, mode)
            # From here as anchor_replay.main computes it.
            res = {"allocator": allocator, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native"),
                   "trace": trace_name(path), "ops": int(ops.shape[0]), "ns_per_op": ns,
                   "peak_live_MiB": maxlive / MiB, "fails": fails,
                   "reserved_before_MiB": (left if mode == 1 else base) / MiB}
            if mode == 0:
                st = torch.cuda.memory_stats()
                res["peak_reserved_MiB"] = (st["reserved_bytes.all.peak"] - base) / MiB
                res["num_device_alloc"] = st["num_device_alloc"]
            elif mode == 1:
                res["peak_reserved_MiB"] = rh / MiB
            res["ratio"] = res.get("peak_reserved_MiB", 0) / res["peak_live_MiB"] if res["peak_live_MiB"] else None
        except Exception as error:  # out of memory, a CUDA error: what is left allocated is unknown
            message = f"{type(error).__name__}: {error}".strip().splitlines()[0]
            print(json.dumps({"allocator": allocator, "trace": trace_name(path), "error": message}), flush=True)
            return 3
        print(json.dumps(res), flush=True)
    return 0


# --- the driver ---

class Finished:
    def __init__(self, returncode, stdout, stderr, timed_out, seconds):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.timed_out, self.seconds = timed_out, seconds


def run_until(command, deadline, env=None):
    """Runs COMMAND to its end or to DEADLINE (time.monotonic()), then kills its process group."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, deadline - start))
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        timed_out = True
    return Finished(process.returncode, stdout, stderr, timed_out, time.monotonic() - start)


def progress(message):
    print(f"record_traces: {message}", file=sys.stderr, flush=True)


def trace_summary(path):
    """(events, peak live bytes) of a plain trace, counted as replay.py's loop counts them."""
    sizes, live, peak, events = {}, 0, 0, 0
    with open(path) as trace:
        for line in trace:
            if line.startswith("#"):
                continue
            op, ident, size, _ = line.split(",")
            events += 1
            if op == "a":
                sizes[ident] = int(size)
                live += int(size)
                peak = max(peak, live)
            else:
                live -= sizes.pop(ident, 0)
    return events, peak


def record(workload, seed, args, work, out, deadline):
    """Records one trace; returns its entry for anchors.json (and its plain trace in WORK, if any)."""
    name = f"{workload}-seed{seed}"
    plain = os.path.join(work, name + ".csv")
    command = [sys.executable, MORE_WORKLOADS, workload, "--seed", str(seed), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--trace", plain]
    env = {key: value for key, value in os.environ.items() if key != "PYTORCH_CUDA_ALLOC_CONF"}  # PyTorch's defaults
    run = run_until(command, deadline, env)
    with open(os.path.join(out, "logs", name + ".record.log"), "w") as log:
        log.write(f"$ {' '.join(command)}\nexit status {run.returncode}, {run.seconds:.1f} s\n--- stdout\n"
                  f"{run.stdout}--- stderr\n{run.stderr}")
    results = json_lines(run.stdout)
    entry = {"workload": workload, "seed": seed, "record_s": round(run.seconds, 1)}
    if results:
        entry["recording"] = results[-1]
    if run.timed_out:
        entry["errors"] = {"record": f"recording stopped at the deadline after {run.seconds:.0f} s"}
    elif run.returncode == UNAVAILABLE_STATUS and results and "unavailable" in results[-1]:
        entry["unavailable"] = results[-1]["unavailable"]
    elif run.returncode != 0:
        entry["errors"] = {"record": last_line(run.stderr) or f"exit status {run.returncode}"}
    elif not results or not results[-1].get("trace_events") or not os.path.exists(plain):
        entry["errors"] = {"record": "no trace written"}
    else:
        events, peak = trace_summary(plain)
        entry.update(peak_live_MiB=round(peak / MiB, 1), ops=events)
        with open(plain, "rb") as source, gzip.open(os.path.join(out, name + ".csv.gz"), "wb") as packed:
            shutil.copyfileobj(source, packed)
        return name, entry, plain
    progress(f"{name}: {entry.get('unavailable') or entry['errors']['record']}")
    return name, entry, None


def record_or_report(job, args, work, out, deadline):
    """record(), with an error of the driver's own (a trace it cannot read) reported as that trace's failure."""
    workload, seed = job
    try:
        return record(workload, seed, args, work, out, deadline)
    except Exception as error:
        progress(f"{workload}-seed{seed}: {type(error).__name__}: {error}")
        return f"{workload}-seed{seed}", {"workload": workload, "seed": seed, "record_s": 0,
                                          "errors": {"record": f"{type(error).__name__}: {error}"}}, None


def replay_all(allocator, plains, work, deadline):
    """Replays PLAINS ({name: path}) under ALLOCATOR, a fresh process again after a failure.
    Returns ({name: result or {"error": message}}, seconds)."""
    mode, conf, _ = ALLOCATORS[allocator]
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(work, "torch_extensions"))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    remaining, results, seconds = list(plains), {}, 0.0
    while remaining:
        if time.monotonic() >= deadline:
            for name in remaining:
                results[name] = {"error": "not replayed: the run reached its deadline"}
            break
        run = run_until([sys.executable, __file__, "--replay-worker", allocator] + [plains[n] for n in remaining],
                        deadline, env)
        seconds += run.seconds
        reported_error = False
        for result in json_lines(run.stdout):
            if result.get("trace") in remaining:
                remaining.remove(result["trace"])
                results[result["trace"]] = result
                reported_error |= "error" in result
        if not remaining:
            break
        if run.timed_out:
            results[remaining.pop(0)] = {"error": f"replay stopped at the deadline ({run.seconds:.0f} s)"}
        elif run.returncode == 0:
            for name in remaining:
                results[name] = {"error": "the replay process printed no result"}
            break
        elif not reported_error:  # it died on the first trace it had left
            results[remaining.pop(0)] = {"error": last_line(run.stderr) or f"exit status {run.returncode}"}
        if remaining:
            progress(f"{allocator}: going on in a fresh process with {len(remaining)} traces left")
    return results, seconds


def add_replay(entry, allocator, result):
    if "error" in result:
        entry.setdefault("errors", {})[allocator] = result["error"]
    elif result.get("fails"):
        entry.setdefault("errors", {})[allocator] = f"{result['fails']:.0f} allocations failed (out of memory)"
    elif result.get("peak_reserved_MiB") is None or result.get("ratio") is None:
        entry.setdefault("errors", {})[allocator] = "no peak reserved measured"
    else:
        entry.setdefault("replay", {})[allocator] = {"peak_reserved_MiB": round(result["peak_reserved_MiB"], 1),
                                                     "ratio": round(result["ratio"], 4),
                                                     "ns_per_op": round(result["ns_per_op"])}


def cell(text, width=60):
    text = str(text).replace("|", "/")
    return text if len(text) <= width else text[:width - 3] + "..."


def table(traces):
    lines = ["| trace | events | peak live MiB | record s | " + " | ".join(f"{a} ratio" for a in ALLOCATORS)
             + " | target min(1.02, expandable) |", "|---|---|---|---|" + "---|" * len(ALLOCATORS) + "---|"]
    for name, entry in sorted(traces.items()):
        if "unavailable" in entry:
            lines.append(f"| {name} | unavailable: {cell(entry['unavailable'])} |" + " |" * (3 + len(ALLOCATORS)))
            continue
        errors, replay = entry.get("errors", {}), entry.get("replay", {})
        if "record" in errors:
            lines.append(f"| {name} | failed: {cell(errors['record'])} | | {entry['record_s']} |"
                         + " |" * (1 + len(ALLOCATORS)))
            continue
        row = [name, str(entry["ops"]), f"{entry['peak_live_MiB']:.1f}", str(entry["record_s"])]
        for allocator in ALLOCATORS:
            row.append(f"{replay[allocator]['ratio']:.4f}" if allocator in replay
                       else "failed: " + cell(errors.get(allocator, "not replayed"), 40))
        expandable = replay.get("torch-expandable")
        row.append(f"{min(1.02, expandable['ratio']):.4f}" if expandable else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main_driver(args):
    start = time.monotonic()
    deadline = start + args.deadline
    out = os.path.abspath(args.out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="record_traces.")
    extension_env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(work, "torch_extensions"))
    jobs = [(w, s) for w in args.workloads for s in args.seeds]
    progress(f"recording {len(jobs)} traces, {args.jobs} at a time; compiling the replay extension meanwhile")
    with ThreadPoolExecutor(1) as compiler, ThreadPoolExecutor(args.jobs) as recorders:
        compiled = compiler.submit(run_until, [sys.executable, __file__, "--replay-worker", COMPILE],
                                   deadline, extension_env)
        # Recordings leave at least a third of the time to the replays.
        record_deadline = start + args.deadline * 2 / 3
        recorded = list(recorders.map(lambda job: record_or_report(job, args, work, out, record_deadline), jobs))
        compiled = compiled.result()
    traces = {name: entry for name, entry, _ in recorded}
    plains = {name: plain for name, _, plain in recorded if plain}
    progress(f"recorded {len(plains)} of {len(jobs)} traces in {time.monotonic() - start:.0f} s; "
             f"extension compiled in {compiled.seconds:.0f} s (exit status {compiled.returncode})")
    replay_seconds = {}
    for allocator in ALLOCATORS:
        if compiled.returncode != 0 or compiled.timed_out:
            message = "the replay extension did not compile: " + (last_line(compiled.stderr) or "stopped at the deadline")
            results = {name: {"error": message} for name in plains}
        else:
            results, replay_seconds[allocator] = replay_all(allocator, plains, work, deadline)
            progress(f"{allocator}: {len(plains)} traces in {replay_seconds[allocator]:.0f} s")
        for name, result in results.items():
            add_replay(traces[name], allocator, result)
    if compiled.returncode != 0:
        with open(os.path.join(out, "logs", "compile.log"), "w") as log:
            log.write(compiled.stdout + compiled.stderr)
    document = {
        "about": "Traces recorded by bench/more_workloads.py (bench/record_traces.py) and replayed through each "
                 "allocator as ../shared/anchors/replay.py does, one process per allocator, each trace from the "
                 "state of a fresh process. ratio = peak reserved / peak live; ns_per_op includes cold segment "
                 "creation. recording: the workload's own JSON line.",
        "allocators": {name: description for name, (_, _, description) in ALLOCATORS.items()},
        "recorded_with": {"steps": args.steps, "warmup": args.warmup, "jobs": args.jobs},
        "replay_s": {name: round(s, 1) for name, s in replay_seconds.items()},
        "total_s": round(time.monotonic() - start, 1),
        "traces": traces,
    }
    with open(os.path.join(out, "anchors.json"), "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    failures = {name: entry["errors"] for name, entry in sorted(traces.items()) if entry.get("errors")}
    unavailable = {name: entry["unavailable"] for name, entry in sorted(traces.items()) if "unavailable" in entry}
    report = [table(traces), ""]
    report.append(f"{len(traces) - len(failures) - len(unavailable)} of {len(traces)} traces recorded and replayed "
                  f"under every allocator in {document['total_s']:.0f} s; unavailable (no pass): "
                  f"{', '.join(f'{n} ({why})' for n, why in unavailable.items()) or 'none'}; failures: "
                  f"{len(failures) or 'none'}")
    for name, errors in failures.items():
        for step, message in errors.items():
            report.append(f"- {name}, {step}: {message}")
    text = "\n".join(report)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def names(text, known=None):
    values = [value for value in text.split(",") if value]
    unknown = [value for value in values if known and value not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the folder for the traces, anchors.json, table.md and logs")
    parser.add_argument("--workloads", type=lambda text: names(text, WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--seeds", type=lambda text: [int(seed) for seed in names(text)], default=[0, 1])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=4, help="recordings at a time")
    parser.add_argument("--deadline", type=float, default=480, help="seconds for the whole run")
    parser.add_argument("--replay-worker", metavar="ALLOCATOR", choices=list(ALLOCATORS) + [COMPILE],
                        help=argparse.SUPPRESS)
    parser.add_argument("traces", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay_worker:
        return replay_worker(args.replay_worker, args.traces)
    if not args.out or args.traces:
        parser.error("give --out DIR (and no trace files)")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return main_driver(args)


if __name__ == "__main__":
    sys.exit(main())
