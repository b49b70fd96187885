// bench/allocator_interface_loop.cpp -- bench/torch_latency.py's loops, run in C++ straight against
// the CUDA allocator torch uses now (c10::cuda::CUDACachingAllocator::get(): PyTorch's own, or gpumem's
// once it is installed).
//
// The Python loop `x = torch.empty(n, device="cuda"); del x` costs Python, the dispatcher, a TensorImpl,
// a StorageImpl and the allocator; subtracting the same loop on CPU tensors leaves the allocator plus
// everything a CUDA tensor costs beyond a CPU one (the "empty" floor). Here there is nothing but the
// allocator's allocate and its deleter, called through the interface PyTorch calls them through, so
// the time per iteration is the allocator's own time and nothing else.
//
// time_stirred does the same between two sweeps of the processor's first-level caches (64 KiB of data
// read, 40 KiB of code jumped through), as an interpreter's loop leaves them between two calls, and
// subtracts the sweeps timed alone: the allocator's own time when little of it is cached.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMebibyte = 1 << 20;
constexpr size_t kStirredBytes = 64 * 1024;

alignas(64) volatile unsigned char stirred_data[kStirredBytes];

// 640 jumps, each to the start of the next 64-byte line: 40 KiB of code fetched for 640 instructions.
__attribute__((noinline)) void stir_code() {
#if defined(__x86_64__)
  asm volatile(".rept 640\n\tjmp 1f\n\t.p2align 6\n1:\n\t.endr" ::: "memory");
#elif defined(__aarch64__)
  asm volatile(".rept 640\n\tb 1f\n\t.p2align 6\n1:\n\t.endr" ::: "memory");
#endif
}

__attribute__((noinline)) void stir_caches() {
  unsigned sum = 0;
  for (size_t i = 0; i < kStirredBytes; i += 64)
    sum += stirred_data[i];
  stirred_data[0] = static_cast<unsigned char>(sum);
  stir_code();
}

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

// Seconds of allocator work in a loop of allocate and free over `sizes` with the caches swept after each
// call: the loop's time less that of the same sweeps alone, timed right after it.
double time_stirred(const std::vector<int64_t> &sizes) {
  c10::cuda::CUDACachingAllocator::CUDAAllocator *allocator = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(allocator, "no CUDA allocator");
  auto started = std::chrono::steady_clock::now();
  for (int64_t size : sizes) {
    c10::DataPtr block = allocator->allocate(static_cast<size_t>(size));
    stir_caches();
    block.clear();
    stir_caches();
  }
  auto middle = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sizes.size(); i++) {
    stir_caches();
    stir_caches();
  }
  auto ended = std::chrono::steady_clock::now();
  std::chrono::duration<double> with_allocator = middle - started, sweeps = ended - middle;
  return with_allocator.count() - sweeps.count();
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("time_pattern", &time_pattern, "seconds for one turn of a pattern through the CUDA allocator interface");
  module.def("time_stirred", &time_stirred, "seconds of allocator work in a loop with the caches swept between calls");
}
