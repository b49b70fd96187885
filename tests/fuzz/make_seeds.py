#!/usr/bin/env python3
"""make_seeds.py -- writes the fuzzers' seed corpora (tests/fuzz/corpus/<harness>/) from scratch.

    python3 tests/fuzz/make_seeds.py        # from the repository root; rewrites corpus/*/seed-*

Traces: the first lines of each trace in data/traces (plain, and gzip-compressed for the plain
reader, also cut short), a hand-written one with several streams, comments and CRLF endings, and a
few malformed ones. fuzz_trace_gzip's inputs are a control byte (bit 0: cut the compressed file
short) and the text that the harness compresses. Configurations: strings in GPUMEM_CONF's form,
valid and not. API sequences: operations of fuzz_api.c, written by name below (OPERATIONS must list
them in the order of its enum operation_kind). Files a fuzzer found and that were added by hand
(any name not starting with seed-) are left alone.
"""
import gzip
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(harness, name, data):
    directory = os.path.join(CORPUS, harness)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "seed-" + name), "wb") as file:
        file.write(data)


def trace_head(name, lines):
    with gzip.open(os.path.join(ROOT, "data", "traces", name), "rb") as file:
        return b"".join(file.readline() for _ in range(lines))


def stable_gzip(data):
    return gzip.compress(data, mtime=0)


HAND_WRITTEN_TRACE = (b"# op,id,size,stream\r\n"
                      b"a,1,4096,0\r\n"
                      b"a,2,2097152,7\r\n"
                      b"\r\n"
                      b"# a comment between events\r\n"
                      b"a,3,0,7\r\n"
                      b"f,2,2097152,7\r\n"
                      b"a,4,1048577,3\r\n"
                      b"f,1,4096,0\r\n"
                      b"f,3,0,7\r\n"
                      b"a,5,1152921504606846977,3\r\n")

MALFORMED_TRACES = {
    "free_not_live.csv": b"a,1,512,0\nf,2,512,0\n",
    "twice_live.csv": b"a,1,512,0\na,1,512,0\n",
    "nul_byte.bin": b"a,1,5\x0012,0\n",
    "three_fields.csv": b"a,1,512\n",
    "no_newline_at_end.csv": b"a,1,512,0\nf,1,512,0",
    "only_comments.csv": b"# nothing\n#\n",
    "live_bytes_past_2_64.csv": b"a,1,18446744073709551615,0\na,2,1,0\n",
}


def traces():
    heads = {name: trace_head(name, lines) for name, lines in
             [("resnet50.csv.gz", 40), ("gpt2.csv.gz", 60), ("bert_varlen.csv.gz", 30), ("llm_generate.csv.gz", 50)]}
    for name, text in heads.items():
        stem = name[:-len(".csv.gz")]
        write("fuzz_trace", stem + ".csv", text)
        write("fuzz_trace_gzip", stem + ".csv", b"\x00" + text)
    write("fuzz_trace", "gpt2.csv.gz", stable_gzip(heads["gpt2.csv.gz"]))
    write("fuzz_trace", "gpt2_cut.csv.gz", stable_gzip(heads["gpt2.csv.gz"])[:-20])
    write("fuzz_trace", "streams.csv", HAND_WRITTEN_TRACE)
    write("fuzz_trace_gzip", "streams.csv", b"\x00" + HAND_WRITTEN_TRACE)
    write("fuzz_trace_gzip", "resnet50_cut.csv", b"\x11" + heads["resnet50.csv.gz"])
    for name, text in MALFORMED_TRACES.items():
        write("fuzz_trace", name, text)
        write("fuzz_trace_gzip", name, b"\x00" + text)


CONFIGURATIONS = {
    "empty": "",
    "small_sim": "backend:sim,capacity:1GiB",
    "segments": "engine:segments,capacity:16GiB,small_size:512KiB,small_segment_size:4MiB,"
                "large_segment_size:32MiB,min_large_alloc:16MiB,release_before_growth:false",
    "host": "backend:host,capacity:64MiB,page_size:64KiB,host_limit:1MiB",
    "pages_switches": "capacity:4GiB,max_chunk_size:0,tail_chunk:true,growth_lane:false,device_credit_ns:0,"
                      "cost_model:False",
    "pressure": "capacity:1GiB,pressure_high:0.9,pressure_low:0.8,pressure_signals:reserved+device+host,"
                "pressure_interval_ms:100",
    "pressure_psi": "pressure_high:0.5,pressure_signals:psi+cgroup,pressure_psi_high:20,pressure_psi_low:5",
    "history_publish": "capacity:1GiB,history:100,publish:true",
    "spaces": " capacity : 1GiB , memory_limit:512m ,",
    "faults": "capacity:2GiB,fault_rate:0.3,fault_seed:7,tail_chunk:true",
    "unknown_key": "capacity:1GiB,colour:blue",
    "bad_size": "capacity:12XB",
    "cuda": "backend:cuda,device:1",
    "too_large": "capacity:2TiB",
}


# fuzz_api.c's operations, in the order of its enum operation_kind.
OPERATIONS = ["malloc", "malloc_again", "free", "free_not_live", "record_stream", "stream_enqueue",
              "stream_complete", "empty_cache", "set_memory_limit", "inject_failures", "pool_begin", "pool_end",
              "pool_retain", "pool_release", "pool_info", "used_elsewhere", "host_malloc", "host_free",
              "host_free_not_live", "host_record_stream", "host_empty_cache", "statistics", "look_around",
              "reset_statistics", "defragment", "fail_host_allocations", "stream_finish_until"]


def sequence(config, *steps):
    """Two configuration bytes, then (operation name, argument bytes...) steps."""
    data = bytearray(config)
    for step in steps:
        data.append(OPERATIONS.index(step[0]))
        data.extend(step[1:])
    return bytes(data)


# Configuration bytes (see create_allocator in fuzz_api.c): first byte bit 0 host backend, bit 1
# segments engine, bits 2-3 capacity, bits 4-5 host_limit; second byte bits 0-1 page size, 2-3 memory limit.
SIM_PAGES_1GIB = (0x04, 0x00)
SIM_SEGMENTS_1GIB = (0x06, 0x00)
HOST_PAGES_64MIB = (0x05, 0x01)
HOST_SEGMENTS_LIMITED = (0x27, 0x00)


def api_sequences():
    # malloc arguments: slot, size kind (and its bytes), stream index.
    yield "alloc_free_sim", sequence(SIM_PAGES_1GIB,
                                     ("malloc", 0, 2, 7, 0), ("malloc", 1, 4, 3, 1, 1), ("malloc", 2, 7, 2, 2),
                                     ("statistics",), ("free", 1), ("free", 0), ("free_not_live", 0, 0),
                                     ("malloc", 3, 0, 0), ("empty_cache",), ("free", 2), ("statistics",))
    yield "cross_stream_segments", sequence(SIM_SEGMENTS_1GIB,
                                            ("malloc", 0, 3, 0, 16, 0, 0), ("record_stream", 0, 1),
                                            ("stream_enqueue", 1, 9), ("free", 0), ("malloc", 1, 3, 0, 16, 0, 0),
                                            ("stream_complete", 1), ("malloc", 2, 3, 0, 16, 0, 0),
                                            ("statistics",), ("empty_cache",))
    yield "pool_capture", sequence(SIM_PAGES_1GIB,
                                   ("pool_begin", 1, 0x07), ("malloc", 0, 4, 2, 1, 1), ("record_stream", 0, 2),
                                   ("free", 0), ("pool_info", 1, 0), ("pool_end", 1), ("malloc", 1, 4, 2, 1, 1),
                                   ("pool_release", 1), ("pool_info", 1, 0), ("empty_cache",), ("statistics",))
    yield "pool_released_early", sequence(SIM_SEGMENTS_1GIB,
                                          ("pool_begin", 2, 0x3c), ("pool_release", 2), ("malloc", 0, 2, 3, 0),
                                          ("free", 0), ("pool_end", 2), ("pool_info", 2, 0))
    yield "device_failures_host", sequence(HOST_PAGES_64MIB,
                                           ("inject_failures", 4, 1, 1), ("malloc", 0, 4, 5, 1, 0),
                                           ("inject_failures", 6, 0, 2), ("malloc", 1, 4, 9, 1, 1),
                                           ("set_memory_limit", 2), ("malloc", 2, 5, 0, 0, 0x40, 0, 2),
                                           ("empty_cache",), ("free", 0), ("free", 1), ("statistics",))
    yield "host_cache", sequence(HOST_SEGMENTS_LIMITED,
                                 ("host_malloc", 0, 1, 0x10, 0), ("host_malloc", 1, 6, 2),
                                 ("host_record_stream", 0, 1), ("stream_enqueue", 1, 3), ("host_free", 0),
                                 ("host_malloc", 2, 1, 0x10, 0), ("host_free_not_live", 0, 0),
                                 ("stream_complete", 1), ("host_empty_cache",), ("statistics",), ("host_free", 2))
    yield "limits_and_huge", sequence(SIM_PAGES_1GIB,
                                      ("malloc", 0, 6, 0, 0), ("malloc", 1, 6, 4, 0), ("malloc", 2, 6, 6, 0),
                                      ("used_elsewhere", 2), ("malloc", 3, 5, 0, 0, 0x80, 0, 0),
                                      ("used_elsewhere", 0), ("set_memory_limit", 1),
                                      ("malloc", 4, 4, 0, 1, 0), ("set_memory_limit", 0), ("statistics",))
    yield "snapshots_history", sequence((0x04, 0x80),
                                        ("malloc", 0, 2, 5, 0), ("look_around", 0), ("look_around", 1, 2),
                                        ("look_around", 3, 1), ("reset_statistics", 1), ("look_around", 2, 0, 0),
                                        ("look_around", 3, 0), ("reset_statistics", 0), ("free", 0))
    # pool_info's last byte: bit 1 sets use_on_oom to bit 0. 40 MiB in a pool of a 64 MiB device, freed
    # there; an allocation outside that does not fit beside it takes the pool's memory.
    for name, config in (("pool_lends_on_oom_pages", (0x00, 0x00)), ("pool_lends_on_oom_segments", (0x02, 0x00))):
        yield name, sequence(config,
                             ("pool_retain", 1), ("pool_begin", 1, 0x00), ("malloc", 0, 5, 0x02, 0x80, 0, 0, 0),
                             ("pool_end", 1), ("free", 0), ("pool_info", 1, 0x03),
                             ("malloc", 1, 4, 3, 0, 0), ("malloc", 2, 5, 0x02, 0x80, 0, 0, 0), ("statistics",),
                             ("free", 2), ("free", 1), ("pool_release", 1), ("pool_info", 1, 0x02))
    # look_around 2: a ring size, then bit 0 resize (else set), bit 2 set the observer (bit 3) or remove it.
    yield "history_resized_observed", sequence((0x04, 0x80),
                                               ("look_around", 2, 40, 0x0c), ("malloc", 0, 2, 5, 0),
                                               ("malloc", 1, 4, 3, 0, 0), ("free", 1), ("look_around", 2, 4, 0x01),
                                               ("look_around", 3, 1), ("look_around", 2, 0, 0x04),
                                               ("look_around", 3, 0), ("free", 0), ("empty_cache",))
    # The segments engine without cost_model: blocks are not split (split_blocks:false).
    # The pages engine with tail_chunk also compacts (compact_min:2MiB on the sim): a 64 MiB chunk pinned by a
    # block at its start, fenced by another, then a 100 MiB request that would lift the peak.
    # The same on the host backend (256 MiB, compact_min two pages): the blocks' stamps check the copies.
    for name, config in (("compaction", (0x44, 0x00)), ("compaction_host", (0x49, 0x00))):
        yield name, sequence(config,
                             ("malloc", 0, 4, 63, 1, 0), ("malloc", 1, 7, 3, 0), ("free", 0),
                             ("malloc", 2, 7, 1, 0), ("malloc", 3, 5, 0x06, 0x3f, 0xff, 0xff, 0), ("statistics",),
                             ("free", 2), ("free", 1), ("free", 3), ("empty_cache",), ("statistics",))
    # A device behind its host: a 48 MiB block freed while work queued before and after its free still runs,
    # part of it finished (stream_finish_until); growths then move its idle chunk ahead of the stream and map
    # over the old place once the work is done.
    yield "moves_ahead_partly_done", sequence(SIM_PAGES_1GIB,
                                              ("malloc", 0, 4, 47, 1, 0), ("malloc", 1, 4, 1, 1, 0),
                                              ("stream_enqueue", 0, 4), ("free", 0), ("stream_enqueue", 0, 3),
                                              ("stream_finish_until", 0, 6),
                                              ("malloc", 2, 5, 0x06, 0x3f, 0xff, 0xff, 0),
                                              ("stream_finish_until", 0, 2), ("malloc", 3, 4, 47, 1, 0),
                                              ("free", 2), ("free", 1), ("stream_finish_until", 0, 0),
                                              ("malloc", 4, 5, 0x06, 0x3f, 0xff, 0xff, 0), ("empty_cache",),
                                              ("statistics",))
    yield "unsplit_segments", sequence((0x06, 0x10),
                                       ("malloc", 0, 4, 3, 0, 0), ("malloc", 1, 4, 3, 0, 0), ("malloc", 2, 2, 7, 0),
                                       ("malloc", 3, 2, 7, 0), ("statistics",), ("free", 0),
                                       ("malloc", 4, 4, 1, 2, 0), ("free", 1), ("empty_cache",), ("statistics",))


def main():
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    for directory in os.listdir(CORPUS) if os.path.isdir(CORPUS) else []:
        for name in os.listdir(os.path.join(CORPUS, directory)):
            if name.startswith("seed-"):
                os.remove(os.path.join(CORPUS, directory, name))
    traces()
    for name, text in CONFIGURATIONS.items():
        write("fuzz_options", name, text.encode())
    for name, data in api_sequences():
        write("fuzz_api", name, data)


if __name__ == "__main__":
    main()
