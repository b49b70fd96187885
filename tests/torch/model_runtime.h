// model_runtime.h -- what tests/torch/test_torch_adapter.cpp sets and reads of the torch model's runtime
// (model_runtime.cpp): the current stream, the profiler's and the GPU trace's switches and what they were
// told, the device's memory as cudaMemGetInfo gives it, PyTorch's allocator settings and allocators.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch_model {

struct ProfilerEvent {
  void *pointer;
  int64_t size;
  size_t allocated, reserved;
};

extern cudaStream_t current_stream;  // getCurrentCUDAStream's stream (0: the default stream)
extern int64_t current_stream_id;    // its id: odd for PyTorch's own streams, the handle for external ones
extern bool profiling;               // c10::memoryProfilingEnabled()
extern std::vector<ProfilerEvent> profiler_events;
extern const c10::impl::PyInterpreter *gpu_trace; // GPUTrace::get_trace()
extern size_t device_total, device_free;          // cudaMemGetInfo
extern std::string allocator_settings;            // setAllocatorSettings' last string
extern std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> current_allocator; // changeCurrentAllocator's
extern c10::Allocator *registered_allocator;      // SetAllocator's for CUDA
extern int uncached_allocations;                  // cudaMalloc calls not yet freed

} // namespace torch_model
