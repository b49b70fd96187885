#!/usr/bin/env bash
# scripts/adapter-compiles.sh -- does the torch adapter compile, on a machine without PyTorch?
#
# The adapter (python/gpumem/torch_adapter.cpp and its torch_*.h) is compiled by torch.utils.cpp_extension
# on the GPU machine, against the installed PyTorch. Where there is no PyTorch (the development machine,
# CI), tests/torch/model/ stands in for the parts of PyTorch 2.11's headers the adapter uses: the same
# names, types and virtual functions, with nothing behind them. It is a model, written from what the
# adapter calls and checked by compiling a version of the adapter that compiled against the real
# PyTorch; it can drift from PyTorch, so a pass here says only that the adapter's own code is consistent
# (names, types, overloads), and the GPU machine's build stays the judge. Both compilers, warnings as
# errors, with CUDA's runtime headers from the CUDA toolkit where it is installed (else the stand-in of
# tests/torch/cuda_runtime). tests/torch/test_torch_adapter.cpp (CTest) runs the adapter over the same model.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${CUDA_HOME:-/usr/local/cuda}/include
[ -f "$cuda/cuda_runtime_api.h" ] || cuda=tests/torch/cuda_runtime
for compiler in g++ clang++; do
    command -v "$compiler" >/dev/null || continue
    "$compiler" -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$cuda" -Itests/torch/model \
        -Iinclude -Ipython/gpumem python/gpumem/torch_adapter.cpp
    echo "$compiler: the torch adapter compiles against tests/torch/model"
done
