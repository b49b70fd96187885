#!/usr/bin/env bash
# test_cuda_refusals.sh -- the cuda backend's refusals on machines where it cannot run, each a clear
# message and a non-zero exit, checked without a GPU: tests/fake_cuda.c stands in for libcuda.so.1
# (LD_LIBRARY_PATH), as a driver too old for gpumem, a driver whose cuInit fails, one that counts no
# device and one with a single device asked for another; and what needs a simulated device.
# Usage: test_cuda_refusals.sh PATH/TO/gpumem FAKE_CUDA_DIRECTORY FAKE_OLD_CUDA_DIRECTORY
set -u
gpumem=$1
fake=$2
fake_old=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect STATUS PATTERN LIBRARY_DIRECTORY MODE -- COMMAND...: with the fake driver of LIBRARY_DIRECTORY
# in MODE, the command exits with STATUS and its output matches the extended regular expression PATTERN.
expect() {
    local status=$1 pattern=$2 directory=$3 mode=$4
    shift 5
    LD_LIBRARY_PATH="$directory${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" GPUMEM_FAKE_CUDA=$mode "$@" >"$work/out" 2>&1
    local got=$?
    if [ "$got" -ne "$status" ] || ! grep -Eq -- "$pattern" "$work/out"; then
        echo "FAIL: GPUMEM_FAKE_CUDA=$mode ($directory) $* -> exit $got (wanted $status), output:"
        sed 's/^/    /' "$work/out" | head -20
        echo "    (wanted /$pattern/)"
        failures=$((failures + 1))
    else
        echo "ok   GPUMEM_FAKE_CUDA=$mode $*"
    fi
}

printf 'a,0,3145728,0\nf,0,3145728,0\n' >"$work/small.csv"

expect 1 "no device: cuda backend: libcuda.so.1 lacks cuDriverGetVersion; the NVIDIA driver is too old" \
    "$fake_old" "" -- "$gpumem" info --backend cuda
expect 1 "no device: cuda backend: cuInit failed \(100: no CUDA-capable device is detected\): no usable GPU" \
    "$fake" init_fails -- "$gpumem" info --backend cuda
expect 1 "cannot create the allocator: no device: cuda backend: the driver sees no CUDA device" \
    "$fake" no_device -- "$gpumem" replay "$work/small.csv" --backend cuda
expect 1 "no device: cuda backend: device 3 does not exist \(1 device\)" \
    "$fake" "" -- "$gpumem" info --backend cuda --conf device:3
# A lead of the host over the device is the simulated devices' (a GPU runs behind its host by itself).
expect 2 "gpumem replay: --lead: a lead of the host over the device needs a simulated device \(--backend sim or host\)" \
    "$fake" "" -- "$gpumem" replay "$work/small.csv" --backend cuda --lead 4
# gpumem tune, which makes allocators of its own, refuses the same way.
expect 1 "gpumem tune: cannot create the allocator .*the driver sees no CUDA device" \
    "$fake" no_device -- "$gpumem" tune "$work/small.csv" --backend cuda

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
