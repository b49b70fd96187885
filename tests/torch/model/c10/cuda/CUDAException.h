// A model of PyTorch's <c10/cuda/CUDAException.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#define C10_CUDA_CHECK(e) do { cudaError_t x_ = (e); TORCH_CHECK(x_ == cudaSuccess, "cuda"); } while (0)
#define C10_CUDA_CHECK_WARN(e) do { cudaError_t x_ = (e); if (x_ != cudaSuccess) TORCH_WARN("cuda"); } while (0)
