// bench/null_allocator.cpp -- a CUDA allocator for PyTorch that does no allocator work, for
// bench/torch_latency.py's "null" contender.
//
// torch_latency.py reads an allocator's time at the Python level as its loop of `torch.empty(n,
// device="cuda"); del x` less the same loop on CPU tensors. What is left still holds what a CUDA tensor
// of n bytes costs beyond a CPU one whatever the allocator does: the dispatcher's CUDA kernels, the
// device guard, a virtual call into the allocator and one to its deleter. The `empty` pattern (0 bytes)
// shows part of that floor, not all of it: PyTorch takes other paths for a tensor that holds no memory.
// This allocator makes the floor itself measurable for every pattern: installed as PyTorch's CUDA
// allocator (through the same CUDAPluggableAllocator route as gpumem's adapter), its allocate asks the
// current device, as every allocator must, and returns one buffer made at the first call; its deleter
// does nothing. The buffer is never written (torch.empty leaves memory as it is), so every tensor may
// share it. Whatever an allocator's loop costs beyond this one's is that allocator's own work.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <limits>
#include <memory>

namespace {

constexpr size_t kBufferBytes = size_t{128} << 20; // at least every size bench/torch_latency.py asks for

void keep(void * /*pointer*/) {}

class NullAllocator : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  NullAllocator()
      : CUDAPluggableAllocator([](size_t, int, cudaStream_t) -> void * { return nullptr; },
                               [](void *, size_t, int, cudaStream_t) {}) {}

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    c10::Device where(c10::DeviceType::CUDA, device);
    if (size == 0)
      return {nullptr, nullptr, &keep, where};
    TORCH_CHECK(size <= kBufferBytes, "null allocator: ", size, " bytes is more than its buffer");
    void *buffer = buffer_.load(std::memory_order_acquire);
    if (!buffer)
      buffer = make_buffer(device);
    return {buffer, buffer, &keep, where};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &keep; }

  void recordStream(const c10::DataPtr &, c10::cuda::CUDAStream) override {}

 private:
  void *make_buffer(c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    void *buffer = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&buffer, kBufferBytes));
    void *expected = nullptr;
    if (!buffer_.compare_exchange_strong(expected, buffer)) {
      C10_CUDA_CHECK(cudaFree(buffer));
      return expected;
    }
    return buffer;
  }

  std::atomic<void *> buffer_{nullptr};
};

void install() {
  auto allocator = std::make_shared<NullAllocator>();
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), std::numeric_limits<uint8_t>::max());
  // Kept for the life of the process, as PyTorch keeps its own allocator.
  new std::shared_ptr<NullAllocator>(allocator);
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("install", &install, "Make the null allocator PyTorch's CUDA allocator (before any CUDA allocation)");
}
