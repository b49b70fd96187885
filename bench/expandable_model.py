"""A model of PyTorch's allocator with expandable_segments:True, replaying a trace on no GPU: what it
reserves against the live peak, pass after pass, to compare with gpumem's `replay --passes N` on the
same trace.

    python3 bench/expandable_model.py TRACE.csv.gz [--passes N]

Prints one JSON line per pass: the pass's live peak, reserved memory at its end (it never shrinks: no
empty_cache) and their ratio, as `gpumem replay --json` reports a pass. Allocations still live at the
end of a pass are freed before the next, as gpumem's replay does.

The rules modelled (PyTorch 2.x's CUDACachingAllocator, read from its source; one stream, as in these
traces):
- Requests are rounded up to 512 bytes; those of at most 1 MiB go to the small pool, the rest to the
  large pool. Each pool is one expandable segment: a range of addresses mapped from its start, in
  handles of 2 MiB (small pool) or 20 MiB (large pool).
- A request takes the smallest free block that fits (ties: the lowest address), except that the free
  block at the segment's mapped end counts as the size it could grow to, so it is taken only when no
  other fits. When none fits, the segment maps handles at its end until the free block there (or a new
  one) holds the request.
- The block taken is split when the rest is at least 512 bytes (small pool) or more than 1 MiB (large
  pool); a freed block merges with free neighbours.
Nothing is ever unmapped (no empty_cache, no out-of-memory retry). The anchors measured on the H200
(`../shared/anchors/anchors.json`, `data/traces-more/anchors.json`) check the model.
"""
import argparse
import bisect
import json
import sys

from trace_file import read_events

SMALL_SIZE = 1 << 20
MIN_BLOCK = 512
HANDLE = {"small": 2 << 20, "large": 20 << 20}


class Block:
    __slots__ = ("address", "size", "free", "prev", "next")

    def __init__(self, address, size, free):
        self.address, self.size, self.free = address, size, free
        self.prev = self.next = None


class Segment:
    """One pool's expandable segment: blocks in address order from 0 to `mapped`."""

    def __init__(self, pool):
        self.pool = pool
        self.mapped = 0
        self.last = None  # the block that ends at `mapped`
        self.free = []  # (size, address, block) of free blocks, the one at the mapped end included

    def _index(self, block):
        bisect.insort(self.free, (block.size, block.address, id(block), block))

    def _unindex(self, block):
        key = (block.size, block.address, id(block))
        position = bisect.bisect_left(self.free, key)
        del self.free[position]

    def _find(self, size):
        position = bisect.bisect_left(self.free, (size,))
        if position == len(self.free):
            return None
        block = self.free[position][3]
        if block is self.last and position + 1 < len(self.free):
            return self.free[position + 1][3]  # the end block grows without limit: any other fit first
        return block

    def _grow(self, size):
        tail = self.last if self.last is not None and self.last.free else None
        have = tail.size if tail else 0
        handle = HANDLE[self.pool]
        more = -(-(size - have) // handle) * handle
        if tail:
            self._unindex(tail)
            tail.size += more
        else:
            tail = Block(self.mapped, more, True)
            tail.prev = self.last
            if self.last is not None:
                self.last.next = tail
            self.last = tail
        self.mapped += more
        self._index(tail)
        return tail

    def allocate(self, size):
        block = self._find(size) or self._grow(size)
        self._unindex(block)
        rest = block.size - size
        splits = rest >= MIN_BLOCK if self.pool == "small" else rest > SMALL_SIZE
        if splits:
            remainder = Block(block.address + size, rest, True)
            remainder.prev, remainder.next = block, block.next
            if block.next is not None:
                block.next.prev = remainder
            block.next = remainder
            if self.last is block:
                self.last = remainder
            block.size = size
            self._index(remainder)
        block.free = False
        return block

    def release(self, block):
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._unindex(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                if self.last is second:
                    self.last = first
                block = first
        self._index(block)


def replay(events, passes):
    pools = {"small": Segment("small"), "large": Segment("large")}
    results = []
    for _ in range(passes):
        live, live_peak, blocks = 0, 0, {}
        for kind, ident, size, _ in events:
            if kind == "a":
                rounded = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
                pool = pools["small" if rounded <= SMALL_SIZE else "large"]
                blocks[ident] = (pool, pool.allocate(rounded), size)
                live += size
                live_peak = max(live_peak, live)
            elif ident in blocks:
                pool, block, requested = blocks.pop(ident)
                pool.release(block)
                live -= requested
        reserved = sum(pool.mapped for pool in pools.values())
        results.append({"peak_live_bytes": live_peak, "peak_reserved_bytes": reserved,
                        "ratio": round(reserved / live_peak, 6) if live_peak else None})
        for pool, block, _ in blocks.values():
            pool.release(block)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--passes", type=int, default=1)
    a = parser.parse_args()
    if a.passes < 1:
        parser.error("--passes wants 1 or more")
    try:
        events = read_events(a.trace)
    except (OSError, ValueError, EOFError) as error:
        print(f"expandable_model: {error}", file=sys.stderr)
        return 1
    for result in replay(events, a.passes):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
