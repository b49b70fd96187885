// model_runtime.cpp -- the functions of tests/torch/model (PyTorch's headers as the adapter uses them) and
// of tests/torch/cuda_runtime, defined as PyTorch and the CUDA runtime behave in the cases the adapter's
// tests reach, with state the tests set and read (model_runtime.h). One device; streams are numbers;
// cudaMalloc is host memory (the gpumem allocators themselves run on the cuda backend over
// tests/fake_cuda.c). A function the tests do not reach throws, so that a test reaching it fails.
#include "model_runtime.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdlib>
#include <stdexcept>

namespace torch_model {
cudaStream_t current_stream = nullptr;
int64_t current_stream_id = 0;
bool profiling = false;
std::vector<ProfilerEvent> profiler_events;
const c10::impl::PyInterpreter *gpu_trace = nullptr;
size_t device_total = size_t(256) << 20, device_free = size_t(200) << 20;
std::string allocator_settings;
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> current_allocator;
c10::Allocator *registered_allocator = nullptr;
int uncached_allocations = 0;

[[noreturn]] void unreached(const char *what) {
  throw std::logic_error(std::string("the torch model does not do ") + what);
}
} // namespace torch_model

using torch_model::unreached;

namespace c10 {
void SetAllocator(DeviceType type, Allocator *allocator, uint8_t) {
  if (type == DeviceType::CUDA)
    torch_model::registered_allocator = allocator;
}
Allocator *GetAllocator(const DeviceType &) { return torch_model::registered_allocator; }
bool memoryProfilingEnabled() { return torch_model::profiling; }
void reportMemoryUsageToProfiler(void *pointer, int64_t size, size_t allocated, size_t reserved, Device) {
  torch_model::profiler_events.push_back({pointer, size, allocated, reserved});
}
namespace impl {
const PyInterpreter *GPUTrace::get_trace() { return torch_model::gpu_trace; }
} // namespace impl
namespace CachingAllocator {
double AcceleratorAllocatorConfig::garbage_collection_threshold() { return 0; }
size_t AcceleratorAllocatorConfig::max_split_size() { return SIZE_MAX; }
bool AcceleratorAllocatorConfig::use_expandable_segments() {
  return torch_model::allocator_settings.find("expandable_segments:True") != std::string::npos;
}
std::string AcceleratorAllocatorConfig::last_allocator_settings() { return torch_model::allocator_settings; }
std::vector<size_t> AcceleratorAllocatorConfig::roundup_power2_divisions() { return std::vector<size_t>(64, 0); }
void setAllocatorSettings(const std::string &settings) { torch_model::allocator_settings = settings; }
} // namespace CachingAllocator
namespace cuda {
CUDAStream getCurrentCUDAStream(DeviceIndex) { return CUDAStream(torch_model::current_stream, torch_model::current_stream_id); }
DeviceIndex device_count() noexcept { return 1; }
DeviceIndex current_device() { return 0; }
CUDAGuard::CUDAGuard(DeviceIndex device) {
  if (device != 0)
    unreached("devices other than 0");
}
CUDAGuard::~CUDAGuard() = default;
namespace CUDACachingAllocator {
CUDAAllocator *get() { return nullptr; } // no allocator of PyTorch's own behind gpumem here
size_t CUDAAllocatorConfig::pinned_num_register_threads() { return 1; }
bool CUDAAllocatorConfig::release_lock_on_cudamalloc() { return false; }
bool CUDAAllocatorConfig::pinned_use_cuda_host_register() { return false; }
bool CUDAAllocatorConfig::graph_capture_record_stream_reuse() { return false; }
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

// A pluggable allocator as PyTorch's: raw_alloc and raw_delete call its functions with the size given
// (kept per pointer), the current device and stream. Its other calls are gpumem's (overridden).
namespace torch::cuda::CUDAPluggableAllocator {
using c10::cuda::MempoolId_t;
using namespace c10::cuda::CUDACachingAllocator;
CUDAPluggableAllocator::CUDAPluggableAllocator(std::function<void *(size_t, int, cudaStream_t)> alloc_fn,
                                               std::function<void(void *, size_t, int, cudaStream_t)> free_fn)
    : alloc_fn_(std::move(alloc_fn)), free_fn_(std::move(free_fn)) {}
void *CUDAPluggableAllocator::raw_alloc(size_t size) {
  void *pointer = alloc_fn_(size, 0, torch_model::current_stream);
  std::lock_guard<std::mutex> guard(sizes_mutex_);
  sizes_[pointer] = size;
  return pointer;
}
void CUDAPluggableAllocator::raw_delete(void *pointer) {
  size_t size = 0;
  {
    std::lock_guard<std::mutex> guard(sizes_mutex_);
    auto found = sizes_.find(pointer);
    if (found == sizes_.end())
      unreached("raw_delete of a pointer it did not allocate");
    size = found->second;
    sizes_.erase(found);
  }
  free_fn_(pointer, size, 0, torch_model::current_stream);
}
c10::DataPtr CUDAPluggableAllocator::allocate(size_t) { unreached("allocate"); }
c10::DeleterFnPtr CUDAPluggableAllocator::raw_deleter() const { unreached("raw_deleter"); }
void *CUDAPluggableAllocator::raw_alloc_with_stream(size_t, cudaStream_t) { unreached("raw_alloc_with_stream"); }
void CUDAPluggableAllocator::init(int) { initialized_ = true; }
bool CUDAPluggableAllocator::initialized() { return initialized_; }
double CUDAPluggableAllocator::getMemoryFraction(c10::DeviceIndex) { unreached("getMemoryFraction"); }
void CUDAPluggableAllocator::setMemoryFraction(double, c10::DeviceIndex) { unreached("setMemoryFraction"); }
void CUDAPluggableAllocator::emptyCache(MempoolId_t) {}
void CUDAPluggableAllocator::enable(bool) {}
bool CUDAPluggableAllocator::isEnabled() const { return true; }
void CUDAPluggableAllocator::cacheInfo(c10::DeviceIndex, size_t *) { unreached("cacheInfo"); }
void *CUDAPluggableAllocator::getBaseAllocation(void *, size_t *) { unreached("getBaseAllocation"); }
void CUDAPluggableAllocator::recordStream(const c10::DataPtr &, c10::cuda::CUDAStream) { unreached("recordStream"); }
c10::CachingDeviceAllocator::DeviceStats CUDAPluggableAllocator::getDeviceStats(c10::DeviceIndex) { unreached("getDeviceStats"); }
void CUDAPluggableAllocator::resetAccumulatedStats(c10::DeviceIndex) { unreached("resetAccumulatedStats"); }
void CUDAPluggableAllocator::resetPeakStats(c10::DeviceIndex) { unreached("resetPeakStats"); }
SnapshotInfo CUDAPluggableAllocator::snapshot(MempoolId_t, bool) { unreached("snapshot"); }
void CUDAPluggableAllocator::beginAllocateToPool(c10::DeviceIndex, MempoolId_t, std::function<bool(cudaStream_t)>) { unreached("beginAllocateToPool"); }
void CUDAPluggableAllocator::endAllocateToPool(c10::DeviceIndex, MempoolId_t) { unreached("endAllocateToPool"); }
void CUDAPluggableAllocator::releasePool(c10::DeviceIndex, MempoolId_t) { unreached("releasePool"); }
ShareableHandle CUDAPluggableAllocator::shareIpcHandle(void *) { unreached("shareIpcHandle"); }
std::shared_ptr<void> CUDAPluggableAllocator::getIpcDevPtr(std::string) { unreached("getIpcDevPtr"); }
void CUDAPluggableAllocator::recordHistory(bool, CreateContextFn, size_t, c10::CachingDeviceAllocator::RecordContext, bool,
                                           const std::vector<std::string> &) { unreached("recordHistory"); }
void CUDAPluggableAllocator::attachOutOfMemoryObserver(OutOfMemoryObserver) { unreached("attachOutOfMemoryObserver"); }
void CUDAPluggableAllocator::attachAllocatorTraceTracker(AllocatorTraceTracker) { unreached("attachAllocatorTraceTracker"); }
void CUDAPluggableAllocator::enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) { unreached("enablePeerAccess"); }
cudaError_t CUDAPluggableAllocator::memcpyAsync(void *, int, const void *, int, size_t, cudaStream_t, bool) { unreached("memcpyAsync"); }
std::shared_ptr<AllocatorState> CUDAPluggableAllocator::getCheckpointState(c10::DeviceIndex, MempoolId_t) { unreached("getCheckpointState"); }
CheckpointDelta CUDAPluggableAllocator::setCheckpointPoolState(c10::DeviceIndex, std::shared_ptr<AllocatorState>) { unreached("setCheckpointPoolState"); }
std::string CUDAPluggableAllocator::name() { return "pluggable"; }
void changeCurrentAllocator(const std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> &allocator) {
  torch_model::current_allocator = allocator;
}
} // namespace torch::cuda::CUDAPluggableAllocator

extern "C" {
cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  *free = torch_model::device_free;
  *total = torch_model::device_total;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned int) { unreached("cudaDeviceEnablePeerAccess"); }
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t) { unreached("cudaMemcpyAsync"); }
cudaError_t cudaMemcpyPeerAsync(void *, int, const void *, int, size_t, cudaStream_t) { unreached("cudaMemcpyPeerAsync"); }
cudaError_t cudaMalloc(void **pointer, size_t size) {
  *pointer = std::malloc(size ? size : 1);
  if (!*pointer)
    return cudaErrorMemoryAllocation;
  torch_model::uncached_allocations++;
  return cudaSuccess;
}
cudaError_t cudaFree(void *pointer) {
  if (pointer)
    torch_model::uncached_allocations--;
  std::free(pointer);
  return cudaSuccess;
}
}
