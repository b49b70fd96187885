// torch_uncached.h -- caching turned off, as PyTorch's allocator does it.
//
// torch.cuda.caching_allocator_enable(False), or PYTORCH_NO_CUDA_MEMORY_CACHING set to a true value
// before the first tensor: each tensor gets a cudaMalloc of its own, given back by cudaFree when it
// dies and not counted in the statistics (so that compute-sanitizer sees each one's bounds).
// Allocations through raw_alloc (caching_allocator_alloc, C++ extensions' raw_allocate) are the
// driver's too, with raw_deleter's cudaFree, as native's since PyTorch 2.x.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "torch_gpu_trace.h"

namespace gpumem_uncached {

// PYTORCH_NO_CUDA_MEMORY_CACHING set to a true value, as PyTorch reads it.
inline bool requested_by_environment() {
  const char *value = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  if (!value)
    return false;
  std::string text(value);
  return !(text.empty() || text == "0" || text == "false" || text == "False" || text == "FALSE");
}

inline void free_pointer(void *pointer) {
  if (pointer) {
    gpumem_gpu_trace::freeing(pointer);
    C10_CUDA_CHECK_WARN(cudaFree(pointer));
  }
}

// A cudaMalloc of its own (nullptr for 0 bytes), for raw_alloc and for a tensor's DataPtr.
inline void *raw_allocate(size_t size, c10::DeviceIndex device) {
  void *pointer = nullptr;
  if (size) {
    c10::cuda::CUDAGuard guard(device);
    cudaError_t error = cudaMalloc(&pointer, size);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", size,
                       " bytes with caching disabled (gpumem)");
    }
    C10_CUDA_CHECK(error);
    gpumem_gpu_trace::allocated(pointer);
  }
  return pointer;
}

inline c10::DataPtr allocate(size_t size, c10::DeviceIndex device) {
  void *pointer = raw_allocate(size, device);
  return {pointer, pointer, &free_pointer, c10::Device(c10::DeviceType::CUDA, device)};
}

}  // namespace gpumem_uncached
