// torch_adapter.cpp -- gpumem as PyTorch's CUDA allocator.
//
// A subclass of PyTorch's CUDAPluggableAllocator that only translates: every call goes to one
// gpumem allocator per device (created on first use in the device's primary context, configured by
// GPUMEM_CONF plus the string given to install()). What torch.cuda users rely on works unchanged:
//   - an allocation that does not fit raises torch.OutOfMemoryError carrying gpumem's report,
//     instead of the null pointer that a plain pluggable allocator hands on;
//   - memory_stats / memory_allocated / memory_reserved / max_* / memory_summary read gpumem's
//     statistics (getDeviceStats), reset_peak_memory_stats and empty_cache reach gpumem;
//   - Tensor.record_stream maps to gm_record_stream, set_per_process_memory_fraction to a memory
//     limit, and cacheInfo (which cuDNN uses to size workspaces) to gm_cache_info.
// CUDA graph capture asks the allocator for a private pool; gpumem does not provide one yet, so
// capture fails with a clear error rather than risking memory that the graph still uses.
// Compiled on first use by gpumem.torch (torch.utils.cpp_extension) against the installed torch.

#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "gpumem.h"

namespace {

using c10::CachingAllocator::StatType;
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr size_t kMaxDevices = 64;
constexpr const char *kNoGraphs =
    "gpumem does not support CUDA graph capture yet (it has no private memory pools for graphs). "
    "Capture graphs with PyTorch's own allocator, or run this part without torch.cuda.graph / "
    "torch.compile(mode='reduce-overhead').";

void *unused_alloc(size_t, int, cudaStream_t) { return nullptr; }
void unused_free(void *, size_t, int, cudaStream_t) {}
void delete_pointer(void *pointer);

class GpumemAllocator final : public CUDAPluggableAllocator {
 public:
  explicit GpumemAllocator(std::string config)
      : CUDAPluggableAllocator(unused_alloc, unused_free), config_(std::move(config)) {}

  ~GpumemAllocator() override = default;

  // The gpumem allocator of a device, created on first use.
  gm_allocator *of(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && static_cast<size_t>(device) < kMaxDevices, "gpumem: device ", device,
                " is out of range");
    gm_allocator *allocator = allocators_[device].load(std::memory_order_acquire);
    if (allocator)
      return allocator;
    std::lock_guard<std::mutex> guard(create_mutex_);
    allocator = allocators_[device].load(std::memory_order_acquire);
    if (!allocator) {
      std::string config = "backend:cuda,device:" + std::to_string(device);
      if (!config_.empty())
        config += "," + config_;
      gm_status status = gm_create_from_environment(config.c_str(), &allocator);
      TORCH_CHECK(status == GM_OK, "gpumem: cannot create the allocator of cuda:", device, ": ",
                  gm_last_error());
      if (created_.load(std::memory_order_relaxed) == 0)
        single_.store(allocator, std::memory_order_relaxed);
      allocators_[device].store(allocator, std::memory_order_release);
      created_.fetch_add(1, std::memory_order_release);
    }
    return allocator;
  }

  void *malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    void *pointer = nullptr;
    if (size == 0)
      return nullptr;
    gm_status status = gm_malloc(of(device), size, reinterpret_cast<gm_stream>(stream), &pointer);
    if (status == GM_ERROR_OUT_OF_MEMORY)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (gpumem). ", gm_last_error());
    TORCH_CHECK(status == GM_OK, "gpumem: ", gm_last_error());
    return pointer;
  }

  // The allocator that owns `pointer`: a lookup in each device's allocator (gm_owns fails nothing,
  // so a pointer of device k costs k quick misses, not k failed frees), or NULL.
  gm_allocator *owner_of(const void *pointer, c10::DeviceIndex *device_out = nullptr) {
    for (size_t device = 0; device < kMaxDevices; device++) {
      gm_allocator *allocator = allocators_[device].load(std::memory_order_acquire);
      if (allocator && gm_owns(allocator, pointer)) {
        if (device_out)
          *device_out = static_cast<c10::DeviceIndex>(device);
        return allocator;
      }
    }
    return nullptr;
  }

  void free_pointer(void *pointer) {
    if (!pointer)
      return;
    // One device in use (the common case): its allocator, without a lookup first.
    gm_allocator *allocator = created_.load(std::memory_order_acquire) == 1
                                  ? single_.load(std::memory_order_relaxed) : owner_of(pointer);
    if (!allocator) {
      TORCH_WARN("gpumem: free of ", pointer, ", which no device allocator owns");
      return;
    }
    gm_status status = gm_free(allocator, pointer);
    if (status != GM_OK)
      TORCH_WARN("gpumem: ", gm_last_error());
  }

  // The device whose allocator owns `pointer` (the current device if none does).
  c10::DeviceIndex device_of(void *pointer) {
    c10::DeviceIndex device = c10::cuda::current_device();
    owner_of(pointer, &device);
    return device;
  }

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    void *pointer = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {pointer, pointer, &delete_pointer, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_pointer; }

  void *raw_alloc(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    return malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void *raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    return malloc_on(size, c10::cuda::current_device(), stream);
  }

  void raw_delete(void *pointer) override { free_pointer(pointer); }

  void init(int device_count) override {
    TORCH_CHECK(static_cast<size_t>(device_count) <= kMaxDevices, "gpumem: more than ", kMaxDevices,
                " devices");
    initialized_ = true;
  }

  bool initialized() override { return initialized_; }

  double getMemoryFraction(c10::DeviceIndex device) override {
    uint64_t limit = 0;
    gm_device_info info;
    gm_get_memory_limit(of(device), &limit);
    gm_get_device_info(of(device), &info);
    return info.total_bytes ? static_cast<double>(limit) / static_cast<double>(info.total_bytes) : 1.0;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction > 0 && fraction <= 1, "gpumem: memory fraction ", fraction, " is not in (0, 1]");
    gm_device_info info;
    gm_get_device_info(of(device), &info);
    gm_set_memory_limit(of(device), static_cast<uint64_t>(fraction * static_cast<double>(info.total_bytes)));
  }

  void emptyCache(c10::cuda::MempoolId_t /*mempool_id*/) override {
    for (auto &slot : allocators_)
      if (gm_allocator *allocator = slot.load(std::memory_order_acquire))
        gm_empty_cache(allocator);
  }

  void cacheInfo(c10::DeviceIndex device, size_t *largest_block) override {
    uint64_t free_bytes = 0, largest = 0;
    gm_cache_info(of(device), &free_bytes, &largest);
    *largest_block = largest;
  }

  void recordStream(const c10::DataPtr &pointer, c10::cuda::CUDAStream stream) override {
    if (!pointer.get())
      return;
    gm_status status = gm_record_stream(of(device_of(pointer.get())), pointer.get(),
                                        reinterpret_cast<gm_stream>(stream.stream()));
    TORCH_CHECK(status == GM_OK, "gpumem: ", gm_last_error());
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gm_stats stats;
    gm_get_stats(of(device), &stats);
    c10::CachingDeviceAllocator::DeviceStats result;
    // Every statistic of gpumem.h's lists that torch has (origin TORCH), under the same name; gpumem's
    // own (origin GPUMEM) are read through gpumem.torch.allocator().memory_stats().
#define COPY_TORCH_STATISTIC(field) copy(result.field, stats.field);
#define COPY_GPUMEM_STATISTIC(field)
#define COPY_STATISTIC(field, label, unit, origin) COPY_##origin##_STATISTIC(field)
    GM_POOL_STATISTICS(COPY_STATISTIC)
#define COPY_TORCH_COUNTER(field) result.field = stats.field;
#define COPY_GPUMEM_COUNTER(field)
#define COPY_COUNTER(field, label, origin) COPY_##origin##_COUNTER(field)
    GM_COUNTERS(COPY_COUNTER)
    return result;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override { gm_reset_accumulated_stats(of(device)); }

  void resetPeakStats(c10::DeviceIndex device) override { gm_reset_peak_stats(of(device)); }

  void beginAllocateToPool(c10::DeviceIndex, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) override {
    TORCH_CHECK(false, kNoGraphs);
  }

  void createOrIncrefPool(c10::DeviceIndex, c10::cuda::MempoolId_t,
                          std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>) override {
    TORCH_CHECK(false, kNoGraphs);
  }

  void endAllocateToPool(c10::DeviceIndex, c10::cuda::MempoolId_t) override {}

  void releasePool(c10::DeviceIndex, c10::cuda::MempoolId_t) override {}

  std::string name() override { return "gpumem"; }

  // The C handle of a device's allocator, for gpumem's Python package.
  uintptr_t handle(c10::DeviceIndex device) { return reinterpret_cast<uintptr_t>(of(device)); }

 private:
  static void copy(c10::CachingDeviceAllocator::StatArray &to, const gm_stat from[GM_POOL_COUNT]) {
    static_assert(static_cast<int>(StatType::AGGREGATE) == GM_POOL_ALL &&
                      static_cast<int>(StatType::SMALL_POOL) == GM_POOL_SMALL &&
                      static_cast<int>(StatType::LARGE_POOL) == GM_POOL_LARGE,
                  "pool order");
    for (int pool = 0; pool < GM_POOL_COUNT; pool++) {
      to[pool].current = from[pool].current;
      to[pool].peak = from[pool].peak;
      to[pool].allocated = from[pool].allocated;
      to[pool].freed = from[pool].freed;
    }
  }

  std::string config_;
  std::array<std::atomic<gm_allocator *>, kMaxDevices> allocators_{};
  std::atomic<int> created_{0};      // allocators made so far
  std::atomic<gm_allocator *> single_{nullptr}; // the first one made (the only one while created_ is 1)
  std::mutex create_mutex_;
};

std::shared_ptr<GpumemAllocator> installed;

void delete_pointer(void *pointer) {
  if (installed)
    installed->free_pointer(pointer);
}

void install(const std::string &config) {
  TORCH_CHECK(!installed, "gpumem is already installed");
  auto allocator = std::make_shared<GpumemAllocator>(config);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  installed = allocator;
}

bool is_installed() { return installed != nullptr; }

uintptr_t handle(int64_t device) {
  TORCH_CHECK(installed, "gpumem is not installed");
  return installed->handle(static_cast<c10::DeviceIndex>(device));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("install", &install, "Make gpumem the CUDA allocator of this process");
  module.def("is_installed", &is_installed);
  module.def("handle", &handle, "The gm_allocator of a device, as an integer");
}
