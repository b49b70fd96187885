// torch_adapter.cpp -- gpumem as PyTorch's CUDA allocator.
//
// A subclass of PyTorch's CUDAPluggableAllocator that only translates: every call goes to one gpumem
// allocator per device (created on first use in the device's primary context, configured by GPUMEM_CONF
// plus the string given to install()). What torch.cuda users rely on works unchanged:
//   - an allocation that does not fit raises torch.OutOfMemoryError with gpumem's report; memory_stats,
//     memory_summary, reset_peak_memory_stats, empty_cache, set_per_process_memory_fraction (a memory
//     limit), record_stream and cacheInfo (cuDNN's workspace sizing) reach gpumem;
//   - torch.multiprocessing shares CUDA tensors with other processes (torch_ipc.h); on two GPUs, torch's
//     peer access reaches gpumem's mappings (gm_enable_peer_access);
//   - the profiler's memory events, and _record_memory_history / _snapshot (memory_viz): gpumem's
//     regions and history ring, with the Python stacks torch gathers kept here, found by event tags;
//   - CUDA graphs, torch.compile's cudagraph trees and torch.cuda.MemPool get gpumem's private pools
//     (gm_begin_allocate_to_pool and its kin; checkpoints through gm_get_pool_allocations and
//     gm_pool_allocate_at); a MemPool with an allocator of its own gets memory from it
//     (torch_pool_sources.h).
// Compiled on first use by gpumem.torch (torch.utils.cpp_extension) against the installed torch.

#include <torch/extension.h>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gpumem.h"
#include "torch_ipc.h"
#include "torch_pool_sources.h"

#include <unistd.h>

namespace {

using c10::CachingAllocator::StatType;
using c10::GatheredContext;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;

// The tag of the adapter call in progress on this thread: gpumem's tagger gives it to the call's events.
thread_local uint64_t current_tag = 0;
uint64_t current_tag_of(void *) { return current_tag; }
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr size_t kMaxDevices = 64;

using StreamFilter = std::function<bool(cudaStream_t)>;

gm_pool_id pool_of(c10::cuda::MempoolId_t id) {
  return gm_pool_id{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}

// gpumem's filter callback: torch's filter for the pool being allocated to. An exception must not
// cross gpumem's C frames: a filter that throws accepts nothing.
int accept_stream(gm_stream stream, void *context) {
  try {
    return (*static_cast<StreamFilter *>(context))(reinterpret_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void *unused_alloc(size_t, int, cudaStream_t) { return nullptr; }
void unused_free(void *, size_t, int, cudaStream_t) {}
void delete_pointer(void *pointer);

// A graph pool's allocations at one moment (getCheckpointState).
struct PoolCheckpoint final : c10::cuda::CUDACachingAllocator::AllocatorState {
  c10::DeviceIndex device = 0;
  c10::cuda::MempoolId_t id{0, 0};
  std::vector<gm_pool_allocation> allocations;
};

// The current device. With one visible device that can only be device 0, so the query (a CUDA runtime
// call, a large part of what an allocation costs at this interface) is skipped; torch's deferred
// set_device cannot name another device either.
c10::DeviceIndex current_device_index() {
  static const bool one_device = c10::cuda::device_count() == 1;
  return one_device ? 0 : c10::cuda::current_device();
}

void *pointer_of(uint64_t address) { return reinterpret_cast<void *>(static_cast<uintptr_t>(address)); }

class GpumemAllocator final : public CUDAPluggableAllocator {
 public:
  GpumemAllocator(std::string config, c10::cuda::CUDACachingAllocator::CUDAAllocator *replaced)
      : CUDAPluggableAllocator(unused_alloc, unused_free), config_(std::move(config)), replaced_(replaced) {}

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
      if (!mentions_publish())
        config += ",publish:true"; // visible to gpumem top by default; publish:false in either turns it off
      if (!config_.empty())
        config += "," + config_;
      gm_status status = gm_create_from_environment(config.c_str(), &allocator);
      TORCH_CHECK(status == GM_OK, "gpumem: cannot create the allocator of cuda:", device, ": ",
                  gm_last_error());
      if (created_.load(std::memory_order_relaxed) == 0)
        single_.store(allocator, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> history_guard(history_mutex_);
        if (history_capacity_)
          apply_history(allocator);
      }
      allocators_[device].store(allocator, std::memory_order_release);
      created_.fetch_add(1, std::memory_order_release);
    }
    return allocator;
  }

  void *malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    void *pointer = nullptr;
    if (size == 0)
      return nullptr;
    bool recording = history_enabled_.load(std::memory_order_relaxed);
    if (recording)
      begin_call(true);
    gm_allocator *allocator = sourced_.route(device, stream); // a MemPool with an allocator of its own
    if (!allocator)
      allocator = of(device);
    gm_status status = gm_malloc(allocator, size, reinterpret_cast<gm_stream>(stream), &pointer);
    if (recording)
      end_call(pointer, true);
    if (status == GM_OK && c10::memoryProfilingEnabled())
      report_to_profiler(allocator, pointer, device, 1);
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

  // The allocator of a pointer being freed or shared: a MemPool's with an allocator of its own, else with
  // one device in use (the common case) its allocator, without a lookup first.
  gm_allocator *owner_of_live(const void *pointer) {
    gm_allocator *pool = sourced_.owner(pointer);
    return pool ? pool : owner_of_device_memory(pointer);
  }

  gm_allocator *owner_of_device_memory(const void *pointer) {
    return created_.load(std::memory_order_acquire) == 1 ? single_.load(std::memory_order_relaxed) : owner_of(pointer);
  }

  void free_pointer(void *pointer) {
    if (!pointer)
      return;
    gm_allocator *pool = sourced_.owner(pointer);
    gm_allocator *allocator = pool ? pool : owner_of_device_memory(pointer);
    if (!allocator) {
      TORCH_WARN("gpumem: free of ", pointer, ", which no device allocator owns");
      return;
    }
    bool profiling = c10::memoryProfilingEnabled();
    size_t size = 0;
    if (profiling)
      gm_allocation_size(allocator, pointer, &size);
    bool recording = history_enabled_.load(std::memory_order_relaxed);
    if (recording)
      begin_call(false);
    gm_status status = gm_free(allocator, pointer);
    if (profiling && status == GM_OK) {
      c10::DeviceIndex device = current_device_index();
      owner_of_any(allocator, &device);
      report_size_to_profiler(allocator, pointer, -static_cast<int64_t>(size), device);
    }
    if (recording)
      end_call(pointer, false);
    if (status != GM_OK) {
      TORCH_WARN("gpumem: ", gm_last_error());
    } else if (pool) {
      sourced_.after_free(pool);
    }
  }

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = current_device_index();
    void *pointer = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {pointer, pointer, &delete_pointer, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_pointer; }

  void *raw_alloc(size_t size) override {
    c10::DeviceIndex device = current_device_index();
    return malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void *raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    return malloc_on(size, current_device_index(), stream);
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
    sourced_.empty_cache();
  }

  void cacheInfo(c10::DeviceIndex device, size_t *largest_block) override {
    uint64_t free_bytes = 0, largest = 0;
    gm_cache_info(of(device), &free_bytes, &largest);
    *largest_block = largest;
  }

  void recordStream(const c10::DataPtr &pointer, c10::cuda::CUDAStream stream) override {
    // Memory gpumem did not hand out (a tensor received from another process) is not its to defer.
    if (!pointer.get() || pointer.get_deleter() != &delete_pointer)
      return;
    gm_allocator *allocator = owner_of_live(pointer.get());
    TORCH_CHECK(allocator, "gpumem: ", pointer.get(), " is not a live allocation");
    gm_status status = gm_record_stream(allocator, pointer.get(), reinterpret_cast<gm_stream>(stream.stream()));
    TORCH_CHECK(status == GM_OK, "gpumem: ", gm_last_error());
  }

  // Two GPUs: torch enables peer access before a copy between them or a kernel of `dev` that reads
  // `dev_to_access`'s memory. The driver's peer access covers plain allocations only; memory mapped with
  // cuMemMap is reachable from a device only where cuMemSetAccess names it, so gpumem grants `dev` every
  // mapping of `dev_to_access`'s allocator, now and later (as native does for expandable segments).
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    {
      c10::cuda::CUDAGuard guard(dev);
      cudaError_t status = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
      else
        C10_CUDA_CHECK(status);
    }
    TORCH_CHECK(gm_enable_peer_access(of(dev_to_access), dev) == GM_OK, "gpumem: ", gm_last_error());
  }

  // torch.multiprocessing sends a CUDA tensor as gpumem's chunks under it (torch_ipc.h); the receiver
  // maps them once per handle while any tensor of it lives, as native caches its opened handles.
  void *getBaseAllocation(void *pointer, size_t *size) override {
    gm_allocator *allocator = owner_of_live(pointer);
    size_t bytes = 0;
    TORCH_CHECK(allocator && gm_allocation_size(allocator, pointer, &bytes) == GM_OK, "gpumem: ", pointer,
                " is not a live allocation");
    if (size)
      *size = bytes;
    return pointer; // an allocation is its own base: shareIpcHandle gives the offset into its chunks
  }

  c10::cuda::CUDACachingAllocator::ShareableHandle shareIpcHandle(void *pointer) override {
    gm_allocator *allocator = owner_of_live(pointer);
    TORCH_CHECK(allocator, "gpumem: ", pointer, " is not a live allocation");
    std::vector<gm_shared_piece> pieces(4);
    uint64_t offset = 0;
    size_t count = 0;
    gm_status status;
    while ((status = gm_share(allocator, pointer, &offset, pieces.data(), pieces.size(), &count)) ==
           GM_ERROR_BUFFER_TOO_SMALL)
      pieces.resize(count);
    TORCH_CHECK(status == GM_OK, "gpumem: cannot share this CUDA tensor with another process: ", gm_last_error());
    pieces.resize(count);
    return {static_cast<ptrdiff_t>(offset), gpumem_ipc::encode(static_cast<int32_t>(getpid()), pieces)};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    std::lock_guard<std::mutex> guard(ipc_mutex_);
    auto found = opened_.find(handle);
    if (found != opened_.end())
      if (std::shared_ptr<void> alive = found->second.lock())
        return alive;
    gpumem_ipc::Share share;
    if (!gpumem_ipc::decode(handle, &share))
      return replaced_ipc_pointer(handle);
    gm_allocator *allocator = of(current_device_index());
    void *pointer = nullptr;
    TORCH_CHECK(gm_open_shared(allocator, share.process, share.pieces.data(), share.pieces.size(), &pointer) == GM_OK,
                "gpumem: cannot map the CUDA tensor process ", share.process, " shared: ", gm_last_error());
    std::shared_ptr<void> mapped(pointer, [this, allocator, handle](void *start) {
      gm_close_shared(allocator, start);
      std::lock_guard<std::mutex> erase_guard(ipc_mutex_);
      auto entry = opened_.find(handle);
      if (entry != opened_.end() && entry->second.expired())
        opened_.erase(entry);
    });
    opened_[handle] = mapped;
    return mapped;
  }

  // A handle of PyTorch's own allocator that gpumem does not map itself (memory of cudaMalloc): the
  // allocator gpumem replaced opens it, made ready for that on first use.
  std::shared_ptr<void> replaced_ipc_pointer(const std::string &handle) {
    TORCH_CHECK(replaced_ && replaced_ != this, "gpumem: cannot open this CUDA IPC handle (",
                handle.empty() ? 0 : static_cast<int>(static_cast<unsigned char>(handle[0])),
                "): not gpumem's, and no other allocator to open it");
    if (!replaced_->initialized())
      replaced_->init(c10::cuda::device_count());
    return replaced_->getIpcDevPtr(handle);
  }

  // A copy between devices without peer access: only cudaMemcpyPeerAsync handles memory that was not
  // made by cudaMalloc (native says the same of its expandable segments).
  cudaError_t memcpyAsync(void *dst, int dst_device, const void *src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gm_stats stats;
    gm_get_stats(of(device), &stats);
    sourced_.add_statistics(device, stats); // MemPools with allocators of their own
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

  // Private pools. The filters live here, in the order their routes were begun, as gpumem keeps them:
  // ending a pool removes the first route of that pool there and the first filter of it here.
  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id, StreamFilter filter) override {
    if (sourced_.has(device, id))
      return sourced_.begin_routing(device, id, std::move(filter));
    gm_allocator *allocator = of(device);
    auto owned = std::make_shared<StreamFilter>(std::move(filter));
    {
      std::lock_guard<std::mutex> guard(pool_mutex_);
      pool_filters_.push_back(PoolFilter{device, id, owned});
    }
    if (gm_begin_allocate_to_pool(allocator, pool_of(id), accept_stream, owned.get()) != GM_OK) {
      std::string reason = gm_last_error();
      drop_filter(device, id);
      TORCH_CHECK(false, "gpumem: ", reason);
    }
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    if (sourced_.has(device, id))
      return sourced_.end_routing(device, id);
    gm_status status = gm_end_allocate_to_pool(of(device), pool_of(id));
    drop_filter(device, id);
    TORCH_CHECK(status == GM_OK, "gpumem: ", gm_last_error());
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                          std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> source) override {
    if ((source && source.get() != this) || sourced_.has(device, id))
      return sourced_.add_user(device, id, std::move(source));
    TORCH_CHECK(gm_retain_pool(of(device), pool_of(id)) == GM_OK, "gpumem: ", gm_last_error());
  }

  // Called from destructors (a graph's, a MemPool's): warns, never throws.
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    if (sourced_.has(device, id))
      return sourced_.release(device, id);
    if (gm_release_pool(of(device), pool_of(id)) != GM_OK)
      TORCH_WARN("gpumem: ", gm_last_error());
  }

  // MemPool(use_on_oom=True) lets other allocations fall back to a pool's memory when the device is full;
  // gpumem keeps a pool's memory to the pool, so the flag only warns (the destructor clears it: quiet).
  void setUseOnOOM(c10::DeviceIndex, c10::cuda::MempoolId_t, bool use_on_oom) override {
    if (use_on_oom)
      TORCH_WARN_ONCE("gpumem: MemPool(use_on_oom=True) is not supported; the pool's memory stays its own");
  }

  std::vector<gm_pool_allocation> pool_allocations(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    gm_allocator *allocator = of(device);
    std::vector<gm_pool_allocation> allocations;
    size_t count = 0;
    do {
      allocations.resize(count);
      TORCH_CHECK(gm_get_pool_allocations(allocator, pool_of(id), allocations.data(), allocations.size(), &count) ==
                      GM_OK,
                  "gpumem: ", gm_last_error());
    } while (count > allocations.size());
    allocations.resize(count);
    return allocations;
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    if (sourced_.has(device, id))
      return sourced_.users(device, id);
    gm_pool_info info;
    return gm_get_pool_info(of(device), pool_of(id), &info) == GM_OK ? static_cast<int>(info.users) : 0;
  }

  // torch.compile's cudagraph trees check that a graph pool holds exactly the tensors they know to be
  // alive (after each recording, with slow_path_cudagraph_asserts, torch's default), as native does.
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                                const std::unordered_set<void *> &expected_live_allocations) override {
    std::vector<gm_pool_allocation> allocations = pool_allocations(device, id);
    if (allocations.size() != expected_live_allocations.size())
      return false;
    for (const gm_pool_allocation &allocation : allocations)
      if (!expected_live_allocations.count(pointer_of(allocation.address)))
        return false;
    return true;
  }

  // Cudagraph trees take a checkpoint of the graph pool after each recording, and put the pool back to
  // one before they record a new branch after replays (which do not go through the allocator).
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(
      c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    auto state = std::make_shared<PoolCheckpoint>();
    state->device = device;
    state->id = id;
    state->allocations = pool_allocations(device, id);
    return state;
  }

  // As native: every allocation of the pool now is freed and every one of the checkpoint made, the
  // delta says so (torch moves the deleters of the tensors that stay). Blocks in both stay as they are;
  // the others are freed, and the checkpoint's are placed at their addresses (gm_pool_allocate_at).
  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> state) override {
    auto checkpoint = std::dynamic_pointer_cast<PoolCheckpoint>(state);
    TORCH_CHECK(checkpoint && checkpoint->device == device, "gpumem: not a checkpoint of gpumem's pool on cuda:", device);
    gm_allocator *allocator = of(device);
    std::vector<gm_pool_allocation> now = pool_allocations(device, checkpoint->id);
    std::set<std::pair<uint64_t, uint64_t>> kept, placed;
    for (const gm_pool_allocation &allocation : checkpoint->allocations)
      kept.insert({allocation.address, allocation.size});
    c10::cuda::CUDACachingAllocator::CheckpointDelta delta;
    for (const gm_pool_allocation &allocation : now) {
      delta.ptrs_freed.push_back(pointer_of(allocation.address));
      if (kept.count({allocation.address, allocation.size}))
        placed.insert({allocation.address, allocation.size});
      else
        free_pointer(pointer_of(allocation.address));
    }
    for (const gm_pool_allocation &allocation : checkpoint->allocations) {
      if (!placed.count({allocation.address, allocation.size}))
        TORCH_CHECK(gm_pool_allocate_at(allocator, pool_of(checkpoint->id), allocation.address, allocation.size,
                                        allocation.requested) == GM_OK,
                    "gpumem: cannot put the CUDA graph pool back to its checkpoint: ", gm_last_error());
      delta.dataptrs_allocd.emplace_back(pointer_of(allocation.address), pointer_of(allocation.address),
                                         &delete_pointer, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  std::string name() override { return "gpumem"; }

  bool isHistoryEnabled() override { return history_enabled_.load(std::memory_order_relaxed); }

  void recordHistory(bool enabled, CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     RecordContext when, bool /*clearHistory*/,
                     const std::vector<std::string> & /*skip_actions*/) override {
    std::lock_guard<std::mutex> guard(history_mutex_);
    size_t capacity = enabled ? std::min<size_t>(std::max<size_t>(alloc_trace_max_entries, 1), 1u << 20) : 0;
    context_recorder_ = enabled ? std::move(context_recorder) : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    contexts_.assign(capacity, nullptr);
    live_tags_.clear();
    history_capacity_ = capacity;
    for (auto &slot : allocators_)
      if (gm_allocator *allocator = slot.load(std::memory_order_acquire))
        apply_history(allocator);
    history_enabled_.store(enabled, std::memory_order_relaxed);
  }

  SnapshotInfo snapshot(c10::cuda::MempoolId_t /*mempool_id*/, bool include_traces) override {
    SnapshotInfo result;
    std::lock_guard<std::mutex> guard(history_mutex_);
    result.device_traces.resize(kMaxDevices);
    size_t devices = 0;
    for (size_t device = 0; device < kMaxDevices; device++) {
      gm_allocator *allocator = allocators_[device].load(std::memory_order_acquire);
      if (!allocator)
        continue;
      devices = device + 1;
      add_segments(allocator, static_cast<c10::DeviceIndex>(device), result);
      sourced_.for_each(static_cast<c10::DeviceIndex>(device),
                        [&](gm_allocator *pool) { add_segments(pool, static_cast<c10::DeviceIndex>(device), result); });
      if (include_traces && history_capacity_)
        add_trace(allocator, static_cast<c10::DeviceIndex>(device), result.device_traces[device]);
    }
    result.device_traces.resize(std::max<size_t>(devices, c10::cuda::device_count()));
    return result;
  }

  // The devices whose allocators exist.
  std::vector<int64_t> created_devices() {
    std::vector<int64_t> devices;
    for (size_t device = 0; device < kMaxDevices; device++)
      if (allocators_[device].load(std::memory_order_acquire))
        devices.push_back(static_cast<int64_t>(device));
    return devices;
  }

  // The C handle of a device's allocator, for gpumem's Python package.
  uintptr_t handle(c10::DeviceIndex device) { return reinterpret_cast<uintptr_t>(of(device)); }

 private:
  struct PoolFilter {
    c10::DeviceIndex device;
    c10::cuda::MempoolId_t id;
    std::shared_ptr<StreamFilter> filter;
  };

  // The first filter of pool `id` on `device` is no longer used by gpumem.
  void drop_filter(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    std::lock_guard<std::mutex> guard(pool_mutex_);
    for (auto it = pool_filters_.begin(); it != pool_filters_.end(); ++it) {
      if (it->device == device && it->id == id) {
        pool_filters_.erase(it);
        return;
      }
    }
  }

  bool mentions_publish() const {
    const char *environment = std::getenv("GPUMEM_CONF");
    return config_.find("publish:") != std::string::npos ||
           (environment && std::string(environment).find("publish:") != std::string::npos);
  }

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

  // The profiler's memory events (profile_memory=True): the block's size, signed, with the totals after
  // the call, as PyTorch's allocator reports them.
  void report_to_profiler(gm_allocator *allocator, void *pointer, c10::DeviceIndex device, int sign) {
    size_t size = 0;
    gm_allocation_size(allocator, pointer, &size);
    report_size_to_profiler(allocator, pointer, sign * static_cast<int64_t>(size), device);
  }

  void report_size_to_profiler(gm_allocator *allocator, void *pointer, int64_t size, c10::DeviceIndex device) {
    gm_stats stats;
    gm_get_stats(allocator, &stats);
    c10::reportMemoryUsageToProfiler(pointer, size, static_cast<size_t>(stats.allocated_bytes[GM_POOL_ALL].current),
                                     static_cast<size_t>(stats.reserved_bytes[GM_POOL_ALL].current),
                                     c10::Device(c10::DeviceType::CUDA, device));
  }

  // The device of `allocator` (its index among the devices' allocators) into *device_out.
  void owner_of_any(gm_allocator *allocator, c10::DeviceIndex *device_out) {
    for (size_t device = 0; device < kMaxDevices; device++)
      if (allocators_[device].load(std::memory_order_acquire) == allocator)
        *device_out = static_cast<c10::DeviceIndex>(device);
  }

  // Called with history_mutex_ held, for a new or every allocator: the ring's size and the tagger.
  void apply_history(gm_allocator *allocator) {
    gm_set_history(allocator, history_capacity_);
    if (history_capacity_)
      gm_set_history_tagger(allocator, current_tag_of, nullptr);
  }

  // Before a recorded allocation or free: a new tag, and the Python stack for it when torch asked for
  // stacks of such calls.
  // The stack is gathered outside the lock, as PyTorch's allocator does: gathering may need the GIL,
  // which another thread may hold while it waits for this lock.
  void begin_call(bool allocating) {
    CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> guard(history_mutex_);
      if (allocating ? when_ != RecordContext::NEVER : when_ == RecordContext::ALL)
        recorder = context_recorder_;
    }
    std::shared_ptr<GatheredContext> stack = recorder ? recorder() : nullptr;
    std::lock_guard<std::mutex> guard(history_mutex_);
    current_tag = ++next_tag_;
    if (!contexts_.empty())
      contexts_[current_tag % contexts_.size()] = std::move(stack);
  }

  void end_call(void *pointer, bool allocated) {
    std::lock_guard<std::mutex> guard(history_mutex_);
    if (allocated && pointer)
      live_tags_[pointer] = current_tag;
    else
      live_tags_.erase(pointer);
    current_tag = 0;
  }

  // The stack of `tag`, if the ring still holds it (history_mutex_ held).
  std::shared_ptr<GatheredContext> stack_of_tag(uint64_t tag) {
    if (!tag || contexts_.empty() || tag + contexts_.size() <= next_tag_)
      return nullptr;
    return contexts_[tag % contexts_.size()];
  }

  // Each run of mapped blocks of a gpumem region is one segment, as PyTorch's snapshot lists them.
  void add_segments(gm_allocator *allocator, c10::DeviceIndex device, SnapshotInfo &result) {
    gm_snapshot *snapshot = nullptr;
    if (gm_snapshot_take(allocator, &snapshot) != GM_OK)
      return;
    bool pages = std::string(snapshot->device.engine) == "pages";
    for (size_t r = 0; r < snapshot->region_count; r++) {
      const gm_snapshot_region &region = snapshot->regions[r];
      c10::CachingDeviceAllocator::SegmentInfo *segment = nullptr;
      for (size_t b = 0; b < region.block_count; b++) {
        const gm_snapshot_block &block = snapshot->blocks[region.first_block + b];
        if (block.kind == GM_BLOCK_KIND_UNMAPPED) {
          segment = nullptr;
          continue;
        }
        if (!segment) {
          result.segments.emplace_back();
          segment = &result.segments.back();
          segment->device = device;
          segment->address = block.address;
          segment->stream = reinterpret_cast<void *>(region.stream);
          segment->is_large = region.pool == GM_POOL_LARGE;
          segment->is_expandable = pages;
        }
        c10::CachingDeviceAllocator::BlockInfo info;
        info.size = block.size;
        info.requested_size = block.requested;
        info.allocated = block.kind == GM_BLOCK_KIND_ALLOCATED;
        info.active = block.kind != GM_BLOCK_KIND_FREE;
        auto live = live_tags_.find(reinterpret_cast<void *>(block.address));
        if (info.allocated && live != live_tags_.end())
          info.context_when_allocated = stack_of_tag(live->second);
        segment->total_size += block.size;
        segment->requested_size += block.requested;
        segment->allocated_size += info.allocated ? block.size : 0;
        segment->active_size += info.active ? block.size : 0;
        segment->blocks.push_back(std::move(info));
      }
    }
    gm_snapshot_free(snapshot);
  }

  void add_trace(gm_allocator *allocator, c10::DeviceIndex device, std::vector<TraceEntry> &trace) {
    size_t count = 0;
    if (gm_history_read(allocator, nullptr, 0, &count, nullptr) != GM_OK)
      return;
    std::vector<gm_event> events(count);
    gm_history_read(allocator, events.data(), events.size(), &count, nullptr);
    gm_device_info info;
    gm_get_device_info(allocator, &info);
    bool pages = std::string(info.engine) == "pages";
    // gpumem's times are CLOCK_MONOTONIC; snapshots carry microseconds since the epoch.
    timespec now_real, now_monotonic;
    clock_gettime(CLOCK_REALTIME, &now_real);
    clock_gettime(CLOCK_MONOTONIC, &now_monotonic);
    int64_t offset_ns = (now_real.tv_sec - now_monotonic.tv_sec) * 1000000000LL + now_real.tv_nsec - now_monotonic.tv_nsec;
    for (size_t i = 0; i < count; i++) {
      const gm_event &event = events[i];
      TraceEntry::Action action = TraceEntry::ALLOC;
      switch (event.kind) {
        case GM_EVENT_ALLOC: action = TraceEntry::ALLOC; break;
        case GM_EVENT_FREE_REQUESTED: action = TraceEntry::FREE_REQUESTED; break;
        case GM_EVENT_FREE_COMPLETED: action = TraceEntry::FREE_COMPLETED; break;
        case GM_EVENT_SEGMENT_MAP: action = pages ? TraceEntry::SEGMENT_MAP : TraceEntry::SEGMENT_ALLOC; break;
        case GM_EVENT_SEGMENT_UNMAP: action = pages ? TraceEntry::SEGMENT_UNMAP : TraceEntry::SEGMENT_FREE; break;
        case GM_EVENT_OOM: action = TraceEntry::OOM; break;
        default: continue; // pressure events: PyTorch's trace has no such action
      }
      std::shared_ptr<GatheredContext> stack = stack_of_tag(event.tag);
      TraceEntry entry(action, device, static_cast<size_t>(event.address), static_cast<size_t>(event.size),
                       reinterpret_cast<void *>(event.stream), c10::cuda::MempoolId_t{0, 0}, c10::approx_time_t{0},
                       stack);
      entry.time_.t_ = static_cast<time_t>((static_cast<int64_t>(event.time_ns) + offset_ns) / 1000);
      trace.push_back(std::move(entry));
    }
  }

  std::string config_;
  std::mutex history_mutex_;
  std::atomic<bool> history_enabled_{false};
  CreateContextFn context_recorder_;
  RecordContext when_ = RecordContext::NEVER;
  size_t history_capacity_ = 0;
  uint64_t next_tag_ = 0;
  std::vector<std::shared_ptr<GatheredContext>> contexts_; // tag % size -> the stack of that call
  std::unordered_map<void *, uint64_t> live_tags_;          // live allocation -> its call's tag
  std::array<std::atomic<gm_allocator *>, kMaxDevices> allocators_{};
  std::atomic<int> created_{0};      // allocators made so far
  std::atomic<gm_allocator *> single_{nullptr}; // the first one made (the only one while created_ is 1)
  std::mutex create_mutex_;
  std::mutex pool_mutex_;
  std::vector<PoolFilter> pool_filters_;
  gpumem_pools::SourcedPools sourced_; // MemPools with an allocator of their own (torch_pool_sources.h)
  std::mutex ipc_mutex_;
  c10::cuda::CUDACachingAllocator::CUDAAllocator *replaced_; // PyTorch's allocator, for its own IPC handles
  std::unordered_map<std::string, std::weak_ptr<void>> opened_; // handle -> memory another process shared
};

std::shared_ptr<GpumemAllocator> installed;

void delete_pointer(void *pointer) {
  if (installed)
    installed->free_pointer(pointer);
}

void install(const std::string &config) {
  TORCH_CHECK(!installed, "gpumem is already installed");
  auto allocator = std::make_shared<GpumemAllocator>(config, c10::cuda::CUDACachingAllocator::get());
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  installed = allocator;
}

bool is_installed() { return installed != nullptr; }

uintptr_t handle(int64_t device) {
  TORCH_CHECK(installed, "gpumem is not installed");
  return installed->handle(static_cast<c10::DeviceIndex>(device));
}

std::vector<int64_t> created_devices() {
  TORCH_CHECK(installed, "gpumem is not installed");
  return installed->created_devices();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("install", &install, "Make gpumem the CUDA allocator of this process");
  module.def("is_installed", &is_installed);
  module.def("handle", &handle, "The gm_allocator of a device, as an integer");
  module.def("created_devices", &created_devices, "The devices whose gm_allocator exists");
}
