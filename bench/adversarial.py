#!/usr/bin/env python3
"""bench/adversarial.py -- allocation patterns chosen to make an allocator pay, replayed on the sim.

Writes one trace per pattern (format of ../shared/README.md: `a|f,id,bytes,stream` lines, gzip)
and replays each with `gpumem replay TRACE --json --passes 2` under both engines, then prints a
Markdown table: ops, peak live, peak reserved, ratio, device calls, and modelled device time per
operation (device_call_ms / ops, in microseconds) for the cold pass and the warm second pass.

Patterns (each about 20,000 operations):
  alternating   alloc+free pairs alternating 1 MiB and 64 MiB (issue 16's example)
  cycling       alloc+free pairs cycling 512 B, 4 KiB, 64 KiB, 1, 3, 17, 64 MiB
  bursts        24 small tensors of 512 KiB live at once, all freed, then a 64 MiB alloc+free; repeated
  ascending     a tensor list that grows: 1, 2, ... 48 MiB kept live, then all freed; repeated
  sawtooth      live memory climbs by mixed-size tensors to ~1.5 GiB, then falls back; repeated
  streams       four streams; each allocates on its own stream and frees what the previous stream
                allocated a round before (the trace's free records the freeing stream; gm_free
                returns memory to the heap of the stream that allocated it), so memory keeps moving
                between the streams' heaps
  random        a seeded mix: log-uniform sizes from 512 B to 128 MiB, up to 64 live, random frees

The "torch model" column is a simple model of PyTorch's native caching allocator on the same trace
(ratio only), documented in torch_native_peak_reserved(): requests rounded up to 512 B; requests of
at most 1 MiB from 2 MiB small segments; larger ones from 20 MiB segments when under 10 MiB, else
from a segment of the request rounded up to 2 MiB; best fit over the free blocks of the stream's
pool (smallest, then lowest address), split when the rest is at least 512 B (small) or more than
1 MiB (large); freed blocks merge with free neighbours; segments are never released (no
empty_cache, no OOM retry). It ignores max_split_size and garbage collection thresholds.

Usage: bench/adversarial.py [--gpumem build/gpumem] [--out DIR] [--conf KEY:VALUE,...]
"""
import argparse
import bisect
import gzip
import json
import os
import random
import subprocess
import sys

KIB, MIB = 1024, 1024 * 1024
EVENT_KINDS = ("event_record", "event_query", "event_synchronize")


class TraceWriter:
    def __init__(self):
        self.lines = ["# op,id,size,stream"]
        self.next_id = 0
        self.sizes = {}

    def allocate(self, size, stream=0):
        identity = self.next_id
        self.next_id += 1
        self.sizes[identity] = size
        self.lines.append(f"a,{identity},{size},{stream}")
        return identity

    def free(self, identity, stream=0):
        self.lines.append(f"f,{identity},{self.sizes.pop(identity)},{stream}")


def alternating(trace):
    for i in range(10000):
        trace.free(trace.allocate(1 * MIB if i % 2 == 0 else 64 * MIB))


def cycling(trace):
    sizes = [512, 4 * KIB, 64 * KIB, 1 * MIB, 3 * MIB, 17 * MIB, 64 * MIB]
    for i in range(10000):
        trace.free(trace.allocate(sizes[i % len(sizes)]))


def bursts(trace):
    for _ in range(400):
        live = [trace.allocate(512 * KIB) for _ in range(24)]
        for identity in live:
            trace.free(identity)
        trace.free(trace.allocate(64 * MIB))


def ascending(trace):
    for _ in range(208):
        live = [trace.allocate(n * MIB) for n in range(1, 49)]
        for identity in live:
            trace.free(identity)


def sawtooth(trace):
    generator = random.Random(7)
    sizes = [generator.choice([3 * MIB, 8 * MIB, 24 * MIB, 40 * MIB + 512, 96 * KIB]) for _ in range(100)]
    for _ in range(100):
        live = [trace.allocate(size) for size in sizes]
        for identity in reversed(live):
            trace.free(identity)


def streams(trace):
    count, previous = 4, {}
    for round_number in range(1250):
        for stream in range(1, count + 1):
            giver = stream - 1 if stream > 1 else count
            if giver in previous:
                for identity in previous.pop(giver):
                    trace.free(identity, stream)
            size = (16 + 4 * ((round_number + stream) % 5)) * MIB
            previous[stream] = [trace.allocate(size, stream), trace.allocate(2 * MIB + 512 * stream, stream)]
    for identities in previous.values():
        for identity in identities:
            trace.free(identity)


def random_mix(trace):
    generator = random.Random(16)
    live = []
    for _ in range(10000):
        if live and (len(live) >= 64 or generator.random() < 0.5):
            trace.free(live.pop(generator.randrange(len(live))))
        else:
            size = int(2 ** generator.uniform(9, 27)) // 512 * 512 or 512
            live.append(trace.allocate(size))
    for identity in live:
        trace.free(identity)


PATTERNS = [("alternating", alternating), ("cycling", cycling), ("bursts", bursts), ("ascending", ascending),
            ("sawtooth", sawtooth), ("streams", streams), ("random", random_mix)]


class TorchPool:
    """One stream's pool (small or large) in the model of PyTorch's caching allocator."""

    def __init__(self):
        self.free = []     # sorted (size, address) of free blocks
        self.blocks = {}   # address -> [size, segment, is_free]
        self.next_address = 0

    def take(self, size, segment_size, split_minimum):
        index = bisect.bisect_left(self.free, (size, -1))
        if index < len(self.free):
            block_size, address = self.free.pop(index)
            new_bytes = 0
        else:
            address, block_size, new_bytes = self.next_address, segment_size, segment_size
            self.next_address += segment_size + 1  # segments never touch
            self.blocks[address] = [block_size, address, True]
        segment = self.blocks[address][1]
        if block_size - size >= split_minimum:
            self.blocks[address + size] = [block_size - size, segment, True]
            bisect.insort(self.free, (block_size - size, address + size))
            block_size = size
        self.blocks[address] = [block_size, segment, False]
        return address, new_bytes

    def give(self, address):
        size, segment, _ = self.blocks[address]
        following = self.blocks.get(address + size)
        if following and following[2] and following[1] == segment:
            self.free.remove((following[0], address + size))
            del self.blocks[address + size]
            size += following[0]
        for start, (other_size, other_segment, other_free) in ((a, self.blocks[a]) for a in self._before(address)):
            if other_free and other_segment == segment and start + other_size == address:
                self.free.remove((other_size, start))
                del self.blocks[address]
                address, size = start, other_size + size
            break
        self.blocks[address] = [size, segment, True]
        bisect.insort(self.free, (size, address))

    def _before(self, address):
        # The block just before `address` of the same segment (a linear search; traces are small).
        best = None
        for start in self.blocks:
            if start < address and (best is None or start > best):
                best = start
        return [best] if best is not None else []


def torch_native_peak_reserved(lines):
    """Peak reserved bytes of the model described in the module's docstring."""
    pools, owner, reserved, peak = {}, {}, 0, 0
    for line in lines[1:]:
        kind, identity, size, stream = line.split(",")
        size = int(size)
        if kind == "a":
            rounded = max(512, (size + 511) // 512 * 512)
            small = rounded <= MIB
            if small:
                segment, split_minimum = 2 * MIB, 512
            elif rounded < 10 * MIB:
                segment, split_minimum = 20 * MIB, MIB + 1
            else:
                segment, split_minimum = (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB), MIB + 1
            pool = pools.setdefault((stream, small), TorchPool())
            address, new_bytes = pool.take(rounded, segment, split_minimum)
            owner[identity] = (pool, address)
            reserved += new_bytes
            peak = max(peak, reserved)
        else:
            pool, address = owner.pop(identity)
            pool.give(address)
    return peak


def replay(gpumem, path, conf):
    command = [gpumem, "replay", path, "--json", "--passes", "2"] + (["--conf", conf] if conf else [])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpumem", default="build/gpumem")
    parser.add_argument("--out", default="build/adversarial")
    parser.add_argument("--conf", default="", help="extra --conf options for both engines")
    parser.add_argument("--engines", default="pages,segments")
    parser.add_argument("--no-torch-model", action="store_true")
    arguments = parser.parse_args()
    os.makedirs(arguments.out, exist_ok=True)
    print("| pattern | engine | ops | peak live MiB | peak reserved MiB | ratio | torch model ratio "
          "| memory device calls cold / warm | events cold / warm | device µs/op cold | device µs/op warm |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, build in PATTERNS:
        trace = TraceWriter()
        build(trace)
        path = os.path.join(arguments.out, f"{name}.csv.gz")
        with gzip.open(path, "wt") as output:
            output.write("\n".join(trace.lines) + "\n")
        torch_ratio = "-"
        for engine in arguments.engines.split(","):
            conf = ",".join(part for part in (f"engine:{engine}", arguments.conf) if part)
            cold, warm = replay(arguments.gpumem, path, conf)
            if torch_ratio == "-" and not arguments.no_torch_model:
                torch_ratio = f"{torch_native_peak_reserved(trace.lines) / cold['peak_live_bytes']:.4f}"
            print(f"| {name} | {engine} | {cold['ops']} | {cold['peak_live_bytes'] / MIB:.1f} "
                  f"| {warm['peak_reserved_bytes'] / MIB:.1f} | {warm['ratio']:.4f} | {torch_ratio} "
                  f"| {memory_calls(cold)} / {memory_calls(warm)} | {event_calls(cold)} / {event_calls(warm)} "
                  f"| {cold['device_call_ms'] * 1000 / cold['ops']:.3f} "
                  f"| {warm['device_call_ms'] * 1000 / warm['ops']:.3f} |", flush=True)


def event_calls(result):
    """The events a replay recorded, asked and waited for (its streams' progress; modelled as free)."""
    return sum(result["device_calls"][kind] for kind in EVENT_KINDS)


def memory_calls(result):
    """The device calls that made, mapped, unmapped or released memory."""
    return result["device_calls"]["total"] - event_calls(result)


if __name__ == "__main__":
    main()
