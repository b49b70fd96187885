// torch_adapter.cpp -- gpumem as PyTorch's CUDA allocator.
//
// A subclass of PyTorch's CUDAPluggableAllocator that only translates: every call goes to one gpumem
// allocator per device (created on first use in the device's primary context, configured by GPUMEM_CONF
// plus the string given to install()). What torch.cuda users rely on works unchanged:
//   - an allocation that does not fit raises torch.OutOfMemoryError with gpumem's report; memory_stats,
//     memory_summary, reset_peak_memory_stats, empty_cache, set_per_process_memory_fraction (a memory
//     limit), record_stream and cacheInfo (cuDNN's workspace sizing: gm_largest_allocation) reach gpumem;
//   - torch.multiprocessing shares CUDA tensors with other processes (torch_ipc.h); on two GPUs, torch's
//     peer access reaches gpumem's mappings (gm_enable_peer_access);
//   - the profiler's memory events, and _record_memory_history / _snapshot (memory_viz): gpumem's
//     regions and history ring, with the Python stacks torch gathers; out-of-memory observers and
//     allocator trace trackers (NCCL's memory registration) (torch_trace.h); torch.cuda._gpu_trace and the
//     CUDA sanitizer hear of every allocation and free (torch_gpu_trace.h); PyTorch's settings as
//     snapshots and ProcessGroupNCCL read them (torch_settings.h);
//   - caching_allocator_enable(False) and PYTORCH_NO_CUDA_MEMORY_CACHING: a cudaMalloc per tensor
//     (torch_uncached.h);
//   - tensors made on a stream PyTorch did not make (torch.cuda.ExternalStream), which its owner may
//     destroy while they live: gpumem never names that stream again (gm_malloc_on_borrowed_stream);
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
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpumem.h"
#include "torch_gpu_trace.h"
#include "torch_ipc.h"
#include "torch_oom.h"
#include "torch_pool_sources.h"
#include "torch_settings.h"
#include "torch_trace.h"
#include "torch_uncached.h"

namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;

using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

constexpr size_t kMaxDevices = 64;

#include "torch_adapter_parts.h" // inside this anonymous namespace: a part of this file

class GpumemAllocator final : public CUDAPluggableAllocator {
 public:
  GpumemAllocator(std::string config, c10::cuda::CUDACachingAllocator::CUDAAllocator *replaced)
      : CUDAPluggableAllocator(unused_alloc, unused_free), config_(std::move(config)), replaced_(replaced) {
    connect_pools(sourced_, observers_, history_);
    sourced_.device_allocator_of = [this](c10::DeviceIndex device) { return existing(device); };
  }

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
      if (!mentions_publish(config_))
        config += ",publish:true"; // visible to gpumem top by default; publish:false in either turns it off
      if (!config_.empty())
        config += "," + config_;
      gm_status status = gm_create_from_environment(config.c_str(), &allocator);
      TORCH_CHECK(status == GM_OK, "gpumem: cannot create the allocator of cuda:", device, ": ",
                  gm_last_error());
      if (pending_fractions_[device] < 1.0)
        apply_fraction(allocator, pending_fractions_[device]);
      if (created_.load(std::memory_order_relaxed) == 0)
        single_.store(allocator, std::memory_order_relaxed);
      // Counted before it is published: a free that sees one allocator counted takes it for the only one
      // (owner_of_device_memory), so a pointer of this one must never meet that count.
      created_.fetch_add(1, std::memory_order_seq_cst);
      history_.adopt(allocator, [&] { allocators_[device].store(allocator, std::memory_order_seq_cst); });
      observers_.watch(allocator, device);
    }
    return allocator;
  }

  void *malloc_on_current(size_t size, c10::DeviceIndex device) {
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    return malloc_on(size, device, current.stream(), is_borrowed(current));
  }

  void *malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream, bool borrowed) {
    void *pointer = nullptr;
    if (size == 0)
      return nullptr;
    bool recording = history_.enabled();
    if (recording)
      history_.begin_call(true);
    gm_allocator *allocator = nullptr;
    try {
      uint64_t begun = 0; // a MemPool with an allocator of its own, unless a newer private route takes it
      allocator = sourced_.route(device, stream, &begun);
      if (!allocator || newer_private_route_takes(device, stream, begun))
        allocator = of(device);
    } catch (...) { // the call's tag and stack must not stay on this thread's later events
      if (recording)
        history_.end_call(nullptr, true);
      throw;
    }
    gm_stream named = reinterpret_cast<gm_stream>(stream);
    gm_status status = borrowed ? gm_malloc_on_borrowed_stream(allocator, size, named, &pointer)
                                : gm_malloc(allocator, size, named, &pointer);
    if (recording)
      history_.end_call(pointer, true);
    if (status == GM_OK) {
      gpumem_gpu_trace::allocated(pointer);
      if (c10::memoryProfilingEnabled())
        report_to_profiler(allocator, pointer, device);
    }
    if (status == GM_ERROR_OUT_OF_MEMORY)
      out_of_memory(size, device);
    TORCH_CHECK(status == GM_OK, "gpumem: ", gm_last_error());
    return pointer;
  }

  // As PyTorch's allocator: the out-of-memory observers first, then torch.OutOfMemoryError, whose message
  // keeps native's sentences and goes on with gpumem's report (torch_oom.h). The report is taken first:
  // an observer that takes a snapshot calls gpumem.
  void out_of_memory(size_t size, c10::DeviceIndex device) {
    std::string report = gm_last_error();
    const std::string own = "gpumem: out of memory. ";
    if (report.compare(0, own.size(), own) == 0)
      report = report.substr(own.size());
    size_t device_free = 0, device_total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess)
        (void)cudaGetLastError();
    }
    double fraction = getMemoryFraction(device);
    size_t limit = fraction < 1.0 ? static_cast<size_t>(fraction * static_cast<double>(device_total)) : device_total;
    gm_stats stats = {};
    gm_get_stats(of(device), &stats);
    gpumem_oom::Reading reading = {device, device_total, device_free, fraction < 1.0 ? limit : 0,
                                   static_cast<uint64_t>(stats.allocated_bytes[GM_POOL_ALL].current),
                                   static_cast<uint64_t>(stats.reserved_bytes[GM_POOL_ALL].current)};
    observers_.out_of_memory(device, size, limit, device_free);
    TORCH_CHECK_WITH(OutOfMemoryError, false, gpumem_oom::message(report, reading));
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
    // What the profiler is told is read while the allocation lives: once it is freed, a released pool
    // with no allocation left may be destroyed by another thread.
    bool profiling = c10::memoryProfilingEnabled();
    size_t size = 0;
    c10::DeviceIndex device = 0;
    if (profiling) {
      gm_allocation_size(allocator, pointer, &size);
      device = pool ? sourced_.device_of(pool, current_device_index()) : device_of(allocator);
    }
    bool recording = history_.enabled();
    if (recording)
      history_.begin_call(false, pointer);
    gpumem_gpu_trace::freeing(pointer);
    gm_status status = gm_free(allocator, pointer);
    if (profiling && status == GM_OK)
      report_size_to_profiler(pointer, -static_cast<int64_t>(size), device);
    if (recording)
      history_.end_call(pointer, false);
    if (status != GM_OK) {
      TORCH_WARN("gpumem: ", gm_last_error());
    } else if (pool) {
      sourced_.after_free(pool);
    }
  }

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = current_device_index();
    if (forced_uncached_ || !caching_.load(std::memory_order_relaxed))
      return gpumem_uncached::allocate(size, device);
    void *pointer = malloc_on_current(size, device);
    return {pointer, pointer, &delete_pointer, c10::Device(c10::DeviceType::CUDA, device)};
  }

  // With caching off, raw allocations are the driver's too, as native's (torch_uncached.h).
  bool caching() const { return !forced_uncached_ && caching_.load(std::memory_order_relaxed); }

  c10::DeleterFnPtr raw_deleter() const override {
    return caching() ? &delete_pointer : &gpumem_uncached::free_pointer;
  }

  // caching_allocator_enable(False) and PYTORCH_NO_CUDA_MEMORY_CACHING (torch_uncached.h).
  void enable(bool value) override { caching_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return caching_.load(std::memory_order_relaxed); }

  void *raw_alloc(size_t size) override {
    c10::DeviceIndex device = current_device_index();
    return caching() ? malloc_on_current(size, device) : gpumem_uncached::raw_allocate(size, device);
  }

  void *raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    // Any stream may come here (caching_allocator_alloc's): one that is not the current stream of
    // PyTorch's own making is taken as borrowed.
    c10::DeviceIndex device = current_device_index();
    if (!caching())
      return gpumem_uncached::raw_allocate(size, device);
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    bool borrowed = stream != nullptr && (stream != current.stream() || is_borrowed(current));
    return malloc_on(size, device, stream, borrowed);
  }

  void raw_delete(void *pointer) override {
    if (caching())
      free_pointer(pointer);
    else
      gpumem_uncached::free_pointer(pointer);
  }

  void init(int device_count) override {
    TORCH_CHECK(static_cast<size_t>(device_count) <= kMaxDevices, "gpumem: more than ", kMaxDevices,
                " devices");
    initialized_ = true;
  }

  bool initialized() override { return initialized_; }

  // A device whose allocator does not exist yet keeps its fraction until the allocator is made: making
  // one makes a CUDA context on that device, which native does not do for a fraction or statistics.
  double getMemoryFraction(c10::DeviceIndex device) override {
    gm_allocator *allocator = existing(device);
    if (!allocator) {
      std::lock_guard<std::mutex> guard(create_mutex_);
      return pending_fractions_[device];
    }
    uint64_t limit = 0;
    gm_device_info info;
    gm_get_memory_limit(allocator, &limit);
    gm_get_device_info(allocator, &info);
    return info.total_bytes ? static_cast<double>(limit) / static_cast<double>(info.total_bytes) : 1.0;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "gpumem: memory fraction ", fraction, " is not in [0, 1]");
    gm_allocator *allocator = nullptr;
    {
      std::lock_guard<std::mutex> guard(create_mutex_);
      allocator = existing(device); // checks the device's index
      pending_fractions_[device] = fraction;
    }
    if (allocator)
      apply_fraction(allocator, fraction);
  }

  // The allocator of a device if it exists, without making one.
  gm_allocator *existing(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && static_cast<size_t>(device) < kMaxDevices, "gpumem: device ", device,
                " is out of range");
    return allocators_[device].load(std::memory_order_acquire);
  }

  // emptyCache(pool id), as MemPool's destructor calls it after releasePool: native gives back that
  // pool's free memory only. A released pool's free memory is ordinary cache to gpumem (gm_release_pool);
  // a released MemPool with an allocator of its own gives its cached segments back to that allocator.
  void emptyCache(c10::cuda::MempoolId_t mempool_id) override {
    if (mempool_id.first != 0 || mempool_id.second != 0)
      return sourced_.empty_cache(&mempool_id);
    for (auto &slot : allocators_)
      if (gm_allocator *allocator = slot.load(std::memory_order_acquire))
        gm_empty_cache(allocator);
    sourced_.empty_cache();
  }

  void cacheInfo(c10::DeviceIndex device, size_t *largest_block) override {
    uint64_t largest = 0;
    if (gm_allocator *allocator = existing(device))
      gm_largest_allocation(allocator, &largest);
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
    uint64_t offset = 0;
    std::string handle = gpumem_ipc::share(allocator, pointer, &offset);
    return {static_cast<ptrdiff_t>(offset), handle};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    return opened_.open(
        handle, [this] { return of(current_device_index()); },
        [this](const std::string &other) { return replaced_ipc_pointer(other); });
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

  // The device's allocator's statistics with its MemPools' with allocators of their own added.
  gm_stats device_totals(c10::DeviceIndex device) {
    gm_stats stats = {};
    if (gm_allocator *allocator = existing(device)) // a device not used yet has none (and no context)
      gm_get_stats(allocator, &stats);
    sourced_.add_statistics(device, stats);
    return stats;
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gm_stats stats = device_totals(device);
    c10::CachingDeviceAllocator::DeviceStats result;
    // Every statistic of gpumem.h's lists that torch has (origin TORCH), under the same name; gpumem's
    // own (origin GPUMEM) are read through gpumem.torch.allocator().memory_stats().
#define COPY_TORCH_STATISTIC(field) copy_statistic(result.field, stats.field);
#define COPY_GPUMEM_STATISTIC(field)
#define COPY_STATISTIC(field, label, unit, origin) COPY_##origin##_STATISTIC(field)
    GM_POOL_STATISTICS(COPY_STATISTIC)
#define COPY_TORCH_COUNTER(field) result.field = stats.field;
#define COPY_GPUMEM_COUNTER(field)
#define COPY_COUNTER(field, label, origin) COPY_##origin##_COUNTER(field)
    GM_COUNTERS(COPY_COUNTER)
    return result;
  }

  // The device's statistics include its MemPools with allocators of their own (getDeviceStats): they
  // are reset with it, as native's one DeviceStats per device is.
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (gm_allocator *allocator = existing(device))
      gm_reset_accumulated_stats(allocator);
    sourced_.for_each_pool(device, [](gm_allocator *pool, c10::cuda::MempoolId_t) { gm_reset_accumulated_stats(pool); });
    sourced_.reset_retired(device, true);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    if (gm_allocator *allocator = existing(device))
      gm_reset_peak_stats(allocator);
    sourced_.for_each_pool(device, [](gm_allocator *pool, c10::cuda::MempoolId_t) { gm_reset_peak_stats(pool); });
    sourced_.reset_retired(device, false);
  }

  // Private pools. The filters live here, in the order their routes were begun, as gpumem keeps them:
  // ending a pool removes the first route of that pool there and the first filter of it here.
  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id, StreamFilter filter) override {
    uint64_t begun = routes_begun_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (sourced_.has(device, id))
      return sourced_.begin_routing(device, id, std::move(filter), begun);
    gm_allocator *allocator = of(device);
    auto owned = std::make_shared<StreamFilter>(std::move(filter));
    {
      std::lock_guard<std::mutex> guard(pool_mutex_);
      pool_filters_.push_back(PoolFilter{device, id, owned, begun});
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

  // MemPool(no_split=True), called right after the pool is made: an allocator of its own whose blocks
  // are never split takes the pool over (torch_pool_sources.h).
  void setNoSplit(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    if (sourced_.has(device, id))
      return sourced_.make_unsplit(device, id, 0, existing(device));
    gm_allocator *allocator = of(device);
    gm_pool_info info;
    TORCH_CHECK(gm_get_pool_info(allocator, pool_of(id), &info) == GM_OK, "gpumem: ", gm_last_error());
    TORCH_CHECK(info.live_allocations == 0, "gpumem: no_split must be set before the memory pool is used");
    try {
      sourced_.make_unsplit(device, id, static_cast<int>(info.users), allocator);
    } catch (...) { // the MemPool is not made, so nothing would release its users
      for (uint32_t user = 0; user < info.users; user++)
        gm_release_pool(allocator, pool_of(id));
      throw;
    }
    for (uint32_t user = 0; user < info.users; user++)
      gm_release_pool(allocator, pool_of(id));
  }

  // Called from destructors (a graph's, a MemPool's): warns, never throws.
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    if (sourced_.has(device, id))
      return sourced_.release(device, id);
    if (gm_release_pool(of(device), pool_of(id)) != GM_OK)
      TORCH_WARN("gpumem: ", gm_last_error());
  }

  // MemPool(use_on_oom=True): allocations elsewhere that would fail may take the pool's free memory
  // (gm_set_pool_use_on_oom; a MemPool with an allocator of its own: SourcedPools::set_use_on_oom).
  // Called from destructors too (clearing the flag of a pool perhaps gone): never throws.
  void setUseOnOOM(c10::DeviceIndex device, c10::cuda::MempoolId_t id, bool use_on_oom) override {
    bool sourced = sourced_.set_use_on_oom(device, id, use_on_oom, use_on_oom ? of(device) : nullptr);
    if (!sourced && gm_set_pool_use_on_oom(of(device), pool_of(id), use_on_oom ? 1 : 0) != GM_OK && use_on_oom) {
      TORCH_WARN("gpumem: ", gm_last_error());
    }
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

  bool isHistoryEnabled() override { return history_.enabled(); }

  void recordHistory(bool enabled, CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     RecordContext when, bool clear_history, const std::vector<std::string> &skip_actions) override {
    history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, skip_actions,
                       [this](auto visit) {
                         for (size_t device = 0; device < kMaxDevices; device++) {
                           if (gm_allocator *allocator = allocators_[device].load(std::memory_order_acquire))
                             visit(allocator);
                           sourced_.for_each_pool(static_cast<c10::DeviceIndex>(device),
                                                  [&](gm_allocator *pool, c10::cuda::MempoolId_t) { visit(pool); });
                         }
                       });
  }

  // Every device's segments, or with a pool named (MemPool.snapshot(), NCCL's registration of a pool)
  // only that pool's.
  SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool_id, bool include_traces) override {
    SnapshotInfo result;
    std::lock_guard<std::mutex> guard(history_.mutex());
    result.device_traces.resize(kMaxDevices);
    size_t devices = 0;
    for (size_t index = 0; index < kMaxDevices; index++) {
      // A device may have MemPools with allocators of their own before its own allocator exists.
      gm_allocator *allocator = allocators_[index].load(std::memory_order_acquire);
      auto device = static_cast<c10::DeviceIndex>(index);
      bool traces = include_traces && history_.keeps_events(), any = allocator != nullptr;
      if (allocator)
        history_.add_segments(allocator, device, result, mempool_id);
      std::vector<TraceEntry> &trace = result.device_traces[index];
      sourced_.for_each_pool(device, [&](gm_allocator *pool, c10::cuda::MempoolId_t id) {
        any = true;
        history_.add_segments(pool, device, result, mempool_id, id);
        if (traces)
          history_.add_trace(pool, device, trace, id);
      });
      if (!any)
        continue;
      devices = index + 1;
      if (traces)
        history_.add_retired(device, trace);
      if (traces && allocator)
        history_.add_trace(allocator, device, trace);
      history_.order(trace);
    }
    result.device_traces.resize(std::max<size_t>(devices, c10::cuda::device_count()));
    result.external_annotations = history_.annotations();
    result.config_metadata = gpumem_settings::config_metadata();
    return result;
  }

  void setUserMetadata(const std::string &metadata) override { history_.set_metadata(metadata); }
  std::string getUserMetadata() override { return history_.metadata(); }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &pairs) override {
    history_.annotate(current_device_index(), pairs);
  }

  void attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) override {
    observers_.attach_out_of_memory(std::move(observer));
  }

  void attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker tracker) override {
    observers_.attach_tracker(std::move(tracker));
    for (size_t index = 0; index < kMaxDevices; index++) {
      auto device = static_cast<c10::DeviceIndex>(index);
      if (gm_allocator *allocator = allocators_[index].load(std::memory_order_seq_cst))
        observers_.watch(allocator, device);
      sourced_.for_each_pool(device, [&](gm_allocator *pool, c10::cuda::MempoolId_t id) {
        observers_.watch(pool, device, id);
      });
    }
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
    uint64_t begun; // routes of both kinds numbered: of those that take a stream, the last begun wins
  };

  // Whether a private pool's route begun after `begun` (a MemPool's with an allocator of its own) takes
  // an allocation on `stream`: gpumem then routes it among its own, the last begun first.
  bool newer_private_route_takes(c10::DeviceIndex device, cudaStream_t stream, uint64_t begun) {
    std::lock_guard<std::mutex> guard(pool_mutex_);
    for (const PoolFilter &route : pool_filters_)
      if (route.device == device && route.begun > begun &&
          accept_stream(reinterpret_cast<gm_stream>(stream), route.filter.get()))
        return true;
    return false;
  }

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

  // The profiler's memory events (profile_memory=True): the block's size, signed, with the device's
  // totals after the call (its MemPools' included), as PyTorch's allocator reports them.
  void report_to_profiler(gm_allocator *allocator, void *pointer, c10::DeviceIndex device) {
    size_t size = 0;
    gm_allocation_size(allocator, pointer, &size);
    report_size_to_profiler(pointer, static_cast<int64_t>(size), device);
  }

  void report_size_to_profiler(void *pointer, int64_t size, c10::DeviceIndex device) {
    gm_stats stats = device_totals(device);
    c10::reportMemoryUsageToProfiler(pointer, size, static_cast<size_t>(stats.allocated_bytes[GM_POOL_ALL].current),
                                     static_cast<size_t>(stats.reserved_bytes[GM_POOL_ALL].current),
                                     c10::Device(c10::DeviceType::CUDA, device));
  }

  // The device of one of the devices' allocators (the current device if none matches).
  c10::DeviceIndex device_of(gm_allocator *allocator) {
    for (size_t device = 0; device < kMaxDevices; device++)
      if (allocators_[device].load(std::memory_order_acquire) == allocator)
        return static_cast<c10::DeviceIndex>(device);
    return current_device_index();
  }

  std::string config_;
  gpumem_trace::History history_;     // _record_memory_history and snapshots (torch_trace.h)
  gpumem_trace::Observers observers_; // out-of-memory observers and trace trackers (torch_trace.h)
  std::atomic<bool> caching_{true};   // caching_allocator_enable
  const bool forced_uncached_ = gpumem_uncached::requested_by_environment();
  std::array<std::atomic<gm_allocator *>, kMaxDevices> allocators_{};
  std::atomic<int> created_{0};      // allocators made so far
  std::atomic<gm_allocator *> single_{nullptr}; // the first one made (the only one while created_ is 1)
  std::mutex create_mutex_;
  std::array<double, kMaxDevices> pending_fractions_ = filled(1.0); // set before the device's allocator
  std::mutex pool_mutex_;
  std::atomic<uint64_t> routes_begun_{0};
  std::vector<PoolFilter> pool_filters_;
  gpumem_pools::SourcedPools sourced_{config_}; // MemPools with allocators of their own (torch_pool_sources.h)
  c10::cuda::CUDACachingAllocator::CUDAAllocator *replaced_; // PyTorch's allocator, for its own IPC handles
  gpumem_ipc::OpenedHandles opened_;
};

// Never destroyed, as native: static destructors run after Python finalized, too late to free the
// history's Python tracebacks (regions are removed by src/monitor/publish.c's atexit handler).
std::shared_ptr<GpumemAllocator> &installed = *new std::shared_ptr<GpumemAllocator>();

void delete_pointer(void *pointer) {
  if (installed)
    installed->free_pointer(pointer);
}

void install(const std::string &config) {
  TORCH_CHECK(!installed, "gpumem is already installed");
  auto allocator = std::make_shared<GpumemAllocator>(config, c10::cuda::CUDACachingAllocator::get());
  gpumem_settings::declare_engine(config);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  // changeCurrentAllocator leaves c10's allocator registry on native's, which torch.accelerator's
  // memory statistics (and code that allocates through c10::GetAllocator) reach.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), std::numeric_limits<uint8_t>::max());
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
