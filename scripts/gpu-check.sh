#!/usr/bin/env bash
# scripts/gpu-check.sh -- everything that needs the GPU machine, in one run: build, CPU tests,
# `gpumem info`, the GPU tests, the GPU tests under compute-sanitizer memcheck, trace replay on the
# cuda backend, and the side-by-side GPU benchmark (bench/gpu_replay.py). Logs and results go to
# $OUT (the device tool's output folder) or ./gpu-results, as gpu-results.tgz and gpu_replay.md.
# Usage: scripts/gpu-check.sh [build|tests|memcheck|bench|python|cudnn|workloads|top|run|whatif|governor|latency|graphs|capped|host|traces|near|stitch|all]...
#        (default: all)
#   python     the PyTorch/CuPy integration tests (tests/gpu/test_torch.py, test_governor.py, test_graphs.py,
#              test_torch_conformance.py: each torch.cuda memory behaviour under native and under gpumem)
#   cudnn      bench/cudnn_workspace.py: convolutions with cudnn.benchmark off and on under each allocator, the
#              workspace cuDNN's plan uses and the time (cuDNN sizes its plans by the allocator's cacheInfo)
#   workloads  bench/torch_workloads.py: real models under every allocator (not part of "all": long)
#   top        a PyTorch process with publish:true seen by gpumem top / gpumem stats from outside
#   run        a training script under `gpumem run --report`, seen by gpumem top from a second shell
#   whatif     python -m gpumem.whatif on native snapshots of resnet50 and gpt2, checked against gpumem replay
#   governor   bench/governor.py: its three tables (under a cap, batch-size finders, leaks; not part of "all": long)
#   latency    bench/torch_latency.py: time per torch.empty/del by allocation pattern, the allocators taking turns (a
#              null allocator among them, for the floor no allocator removes; LATENCY_ARGS, e.g. "--repeats 6", or
#              "--baseline-library OTHER/libgpumem.so": another build taking turns, for a change's effect), and
#              build-gpu/gpumem_core_latency: the C core alone on the same patterns (not in "all")
#   graphs     bench/graph_workloads.py: workloads run through CUDA graphs (a captured training step, decode graphs
#              sharing one pool, torch.compile reduce-overhead training and inference) under torch-native,
#              torch-expandable and gpumem: time per iteration, memory, outputs bit for bit (not in "all")
#   capped     bench/capped_steps.py: step time of resnet50 and gpt2 under torch's memory fraction, capped at
#              1.01 / 1.05 x gpumem's own need and at 1.03 / 1.5 x torch-native's, and uncapped with
#              torch.cuda.empty_cache() at every step (not in "all"; about 15 minutes: CAPPED_ARGS="--repeats 1"
#              for about 8)
#   multi      bench/multi_gpu.py: DDP and FSDP2 on two GPUs (torchrun), native vs gpumem (not in "all"; 2 GPUs;
#              MULTI_ARGS="--gpus 1" on a machine of one)
#   host       host memory and pinned memory (not in "all"): `gpumem doctor` and `--json`, doctor --pid on a
#              PyTorch trainer with 4 DataLoader workers (tests/gpu/doctor_dataloader.sh), CuPy's pinned memory
#              through gpumem (tests/gpu/test_cupy_pinned.py), CuPy's pool calls (test_cupy_pools.py),
#              bench/pinned_host.py's table of pinned allocators (pinned_host.md, pinned_host.jsonl), and
#              bench/cupy_alloc.py's time per CuPy allocation, CuPy's pool against gpumem (cupy_alloc.md), and
#              bench/cupy_parts.py's parts of one such allocation in one process (cupy_parts.md)
#   stitch     stitch:true against stitch:false (not in "all"; about 6 minutes): bench/more_models_gpu.py on ViT and
#              the UNet (STITCH_RUNS, default vit:0,vit:1,unet:0,unet:1; 12 steps each), then the conformance suite
#              with GPUMEM_CONF=stitch:true
#   near       bench/near_capacity_gpu.py: training on a device that the run nearly fills (the rest taken first),
#              under torch-native, torch-expandable, gpumem, gpumem without the room share (gpumem-whole) and
#              gpumem with the page-sized chunks its OOM report offers (not in "all"; NEAR_ARGS, e.g. "--runs vit:0
#              --factors 1.02 --allocators gpumem,gpumem-whole")
#   traces     bench/record_traces.py (not in "all"; needs no build): new traces of bench/more_workloads.py's
#              workloads, two seeds each, replayed under torch-native, torch-expandable and cuda-async, into
#              logs/more_traces (NAME-seedS.csv.gz, anchors.json, table.md; in gpu-results.tgz); then, where
#              gpumem is built: python3 bench/more_traces_table.py logs/more_traces/anchors.json
set -uo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-gpu-results}
out="$results/logs"
mkdir -p "$out"
# Everything is bundled into gpu-results.tgz at the end (the device tool returns at most 8 files).
trap 'tar czf "$results/gpu-results.tgz" -C "$results" logs 2>/dev/null; cp "$out/gpu_replay.md" "$results/" 2>/dev/null' EXIT
build=build-gpu
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
failed=0

if has build || has tests || has memcheck || has bench || has python || has cudnn || has whatif || has top || has run || [[ " $steps " == *" workloads "* || " $steps " == *" governor "* || " $steps " == *" latency "* || " $steps " == *" graphs "* \
    || " $steps " == *" capped "* || " $steps " == *" host "* || " $steps " == *" multi "* || " $steps " == *" near "* \
    || " $steps " == *" stitch "* ]]; then
    { cmake -S . -B $build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build $build -j"$(nproc)"; } >"$out/build.log" 2>&1 \
        || { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
    echo "built"
fi
if has tests; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
    $build/gpumem info --backend cuda | tee "$out/info.txt" || failed=1
    ctest --test-dir $build -E test_gpu -j"$(nproc)" --output-on-failure >"$out/ctest.log" 2>&1 || { failed=1; echo "CPU tests failed"; }
    tail -3 "$out/ctest.log"
    GPUMEM_DATA=data $build/tests/test_gpu 2>&1 | tee "$out/test_gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    for trace in data/traces/*.csv.gz; do $build/gpumem replay "$trace" --backend cuda --json; done | tee "$out/replay_cuda.jsonl"
fi
if has memcheck; then
    GPUMEM_DATA=data GPUMEM_GPU_TEST_QUICK=1 GPUMEM_GPU_TEST_UNDER_SANITIZER=1 compute-sanitizer --tool memcheck --error-exitcode 99 \
        $build/tests/test_gpu >"$out/memcheck.log" 2>&1
    status=$?
    echo "compute-sanitizer memcheck exit status $status"; tail -4 "$out/memcheck.log"
    [ "$status" -eq 0 ] || failed=1
fi
if has bench; then
    python3 bench/gpu_replay.py --library $build/libgpumem.so --traces data/traces --out "$out/gpu_replay.jsonl" \
        2>"$out/bench.err" | tee "$out/gpu_replay.md"
    tail -5 "$out/bench.err"
fi
if has python; then
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q tests/gpu/test_torch.py \
        2>&1 | tee "$out/test_torch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    # Each file in a process of its own: a failed graph capture may leave CUDA state behind.
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q tests/gpu/test_governor.py \
        2>&1 | tee "$out/test_governor.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q tests/gpu/test_graphs.py \
        2>&1 | tee "$out/test_graphs.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q -rs tests/gpu/test_torch_conformance.py \
        2>&1 | tee "$out/test_torch_conformance.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if has cudnn; then
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/cudnn_workspace.py --out "$out/cudnn_workspace.jsonl" \
        2>"$out/cudnn_workspace.err" | tee "$out/cudnn_workspace.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/cudnn_workspace.err"; }
fi
if has top; then
    tests/gpu/top_while_training.sh $build 2>&1 | tee "$out/top.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if has run; then
    tests/gpu/run_training.sh $build 2>&1 | tee "$out/run.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if has whatif; then
    for workload in resnet50 gpt2; do
        python3 tests/gpu/native_snapshot.py $workload 6 "$out/$workload.pickle" 2>&1 | tail -1 | tee -a "$out/whatif.log"
        PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m gpumem.whatif "$out/$workload.pickle" \
            --trace "$out/$workload-whatif.csv" 2>&1 | tee -a "$out/whatif.log" || failed=1
        $build/gpumem replay "$out/$workload-whatif.csv" --json | tee -a "$out/whatif.log" || failed=1
        rm -f "$out/$workload.pickle"
    done
fi
if [[ " $steps " == *" workloads "* ]]; then
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/torch_workloads.py --out "$out/torch_workloads.jsonl" \
        ${WORKLOADS_ARGS:-} 2>&1 | tee "$out/torch_workloads.md"
fi
if [[ " $steps " == *" latency "* ]]; then
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/torch_latency.py --out "$out/torch_latency.jsonl" \
        ${LATENCY_ARGS:-} 2>"$out/torch_latency.err" | tee "$out/torch_latency.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/torch_latency.err"; }
    $build/gpumem_core_latency backend:cuda 2>&1 | tee "$out/core_latency.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [[ " $steps " == *" graphs "* ]]; then
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/graph_workloads.py --out "$out/graph_workloads.jsonl" \
        ${GRAPHS_ARGS:-} 2>"$out/graph_workloads.err" | tee "$out/graph_workloads.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -30 "$out/graph_workloads.err"; }
fi
if [[ " $steps " == *" capped "* ]]; then
    for reference in gpumem:1.01,1.05 torch-native:1.03,1.5 "torch-native:none --empty-cache"; do
        PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/capped_steps.py --workloads resnet50,gpt2 \
            --relative-to "${reference%%:*}" --margins ${reference#*:} --steps 15 --repeats 2 ${CAPPED_ARGS:-} \
            --out "$out/capped_steps.jsonl" 2>>"$out/capped_steps.err" | tee -a "$out/capped_steps.md"
        [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/capped_steps.err"; }
    done
fi
if [[ " $steps " == *" stitch "* ]]; then
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/more_models_gpu.py --runs "${STITCH_RUNS:-vit:0,vit:1,unet:0,unet:1}" \
        --allocators gpumem-unstitched,gpumem-stitch --steps 10 --out "$out/stitch_models.jsonl" 2>"$out/stitch_models.err" \
        | tee "$out/stitch_models.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/stitch_models.err"; }
    GPUMEM_CONF=stitch:true PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q -rs \
        tests/gpu/test_torch_conformance.py 2>&1 | tee "$out/conformance_stitch.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [[ " $steps " == *" near "* ]]; then
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/near_capacity_gpu.py --out "$out/near_capacity_gpu.jsonl" \
        ${NEAR_ARGS:-} 2>"$out/near_capacity_gpu.err" | tee "$out/near_capacity_gpu.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/near_capacity_gpu.err"; }
fi
if [[ " $steps " == *" multi "* ]]; then
    python3 bench/multi_gpu.py --out "$out/multi_gpu.jsonl" ${MULTI_ARGS:-} 2>"$out/multi_gpu.err" | tee "$out/multi_gpu.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/multi_gpu.err"; }
fi
if [[ " $steps " == *" governor "* ]]; then
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/governor.py --out "$out/governor.jsonl" \
        ${GOVERNOR_ARGS:-} 2>"$out/governor.err" | tee "$out/governor.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/governor.err"; }
fi
if [[ " $steps " == *" traces "* ]]; then
    # Inside $out, so that the trap's tar takes the traces along.
    python3 bench/record_traces.py --out "$out/more_traces" ${TRACES_ARGS:-} 2>&1 | tee "$out/more_traces.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [[ " $steps " == *" host "* ]]; then
    $build/gpumem doctor | tee "$out/doctor.txt"
    [[ "${PIPESTATUS[0]}" =~ ^(0|4|5)$ ]] || failed=1  # 4, 5: the worst finding is warn, fail; 1, 2: errors
    $build/gpumem doctor --json >"$out/doctor.json"
    [[ "$?" =~ ^(0|4|5)$ ]] || failed=1
    tests/gpu/doctor_dataloader.sh $build 2>&1 | tee "$out/doctor_dataloader.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 -m pytest -q -rs tests/gpu/test_cupy_pinned.py \
        tests/gpu/test_cupy_pools.py \
        2>&1 | tee "$out/test_cupy_pinned.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/pinned_host.py --out "$out/pinned_host.jsonl" \
        2>"$out/pinned_host.err" | tee "$out/pinned_host.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=1; tail -20 "$out/pinned_host.err"; }
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/cupy_alloc.py --out "$out/cupy_alloc.jsonl" \
        | tee "$out/cupy_alloc.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    GPUMEM_LIBRARY=$PWD/$build/libgpumem.so python3 bench/cupy_parts.py | tee "$out/cupy_parts.md"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
exit $failed
