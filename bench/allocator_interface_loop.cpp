// bench/allocator_interface_loop.cpp -- bench/torch_latency.py's loops, run in C++ straight against
// the CUDA allocator torch uses now (c10::cuda::CUDACachingAllocator::get(): PyTorch's own, or gpumem's
// once it is installed).
//
// The Python loop `x = torch.empty(n, device="cuda"); del x` costs Python, the dispatcher, a TensorImpl,
// a StorageImpl and the allocator; subtracting the same loop on CPU tensors leaves the allocator plus
// everything a CUDA tensor costs beyond a CPU one (the "empty" floor). Here there is nothing but the
// allocator's allocate and its deleter, called through the interface PyTorch calls them through, so
// the time per iteration is the allocator's own time and nothing else.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMebibyte = 1 << 20;

// Seconds for one turn of `pattern` over `sizes` (bytes), as bench/torch_latency.py's time_loop does it.
double time_pattern(const std::string &pattern, const std::vector<int64_t> &sizes) {
  c10::cuda::CUDACachingAllocator::CUDAAllocator *allocator = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(allocator, "no CUDA allocator");
  std::vector<c10::cuda::CUDAStream> streams;
  if (pattern == "streams")
    for (int i = 0; i < 4; i++)
      streams.push_back(c10::cuda::getStreamFromPool());
  std::vector<c10::DataPtr> held;
  held.reserve(64);
  auto started = std::chrono::steady_clock::now();
  if (pattern == "ascending") {
    for (size_t i = 0; i < sizes.size(); i++) {
      held.push_back(allocator->allocate(static_cast<size_t>(sizes[i])));
      if (held.size() == 64)
        held.clear();
    }
    held.clear();
  } else if (pattern == "streams") {
    for (size_t i = 0; i < sizes.size(); i++) {
      c10::DataPtr block;
      {
        c10::cuda::CUDAStreamGuard guard(streams[i % 4]);
        block = allocator->allocate(4 * kMebibyte);
      }
      allocator->recordStream(block, streams[(i + 1) % 4]);
    }
  } else {
    for (int64_t size : sizes) {
      c10::DataPtr block = allocator->allocate(static_cast<size_t>(size));
    }
  }
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started;
  return elapsed.count();
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("time_pattern", &time_pattern, "seconds for one turn of a pattern through the CUDA allocator interface");
}
