// A model of PyTorch's <c10/cuda/CUDACachingAllocator.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/util/ApproximateClock.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <array>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>
namespace c10 {
using CaptureId_t = unsigned long long;
namespace CachingDeviceAllocator {
struct Stat { int64_t current = 0, peak = 0, allocated = 0, freed = 0; };
using StatArray = std::array<Stat, 3>;
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_sync_all_streams = 0, num_device_alloc = 0, num_device_free = 0;
  Stat oversize_allocations, oversize_segments; int64_t max_split_size = 0;
};
enum struct RecordContext { NEVER = 0, STATE = 1, ALLOC = 2, ALL = 3 };
union trace_time_ { time_t t_; approx_time_t approx_t_; };
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM, USER_DEFINED };
  TraceEntry(Action action, c10::DeviceIndex device, size_t addr, size_t size, void *stream,
             std::pair<unsigned long long, unsigned long long> mempool, approx_time_t time,
             std::shared_ptr<GatheredContext> context = nullptr, std::string compile_context = "",
             std::string user_metadata = "")
      : action_(action), device_(device), addr_(addr), context_(std::move(context)), stream_(stream), size_(size), mempool_(std::move(mempool)),
        compile_context_(std::move(compile_context)), user_metadata_(std::move(user_metadata)) { time_.approx_t_ = time; }
  Action action_; c10::DeviceIndex device_; size_t addr_; std::shared_ptr<GatheredContext> context_; void *stream_{}; size_t size_;
  std::pair<unsigned long long, unsigned long long> mempool_; trace_time_ time_{}; std::string compile_context_, user_metadata_;
};
struct BlockInfo { size_t size = 0, requested_size = 0; int32_t gc_counter = 0; bool allocated = false, active = false; std::shared_ptr<GatheredContext> context_when_allocated; };
struct SegmentInfo {
  c10::DeviceIndex device = 0; size_t address = 0, total_size = 0, requested_size = 0, allocated_size = 0, active_size = 0;
  void *stream = nullptr; bool is_large = false, is_expandable = false; std::pair<unsigned long long, unsigned long long> owner_private_pool_id = {0, 0};
  std::vector<BlockInfo> blocks; std::shared_ptr<GatheredContext> context_when_allocated;
};
struct AnnotationEntry {
  AnnotationEntry(c10::DeviceIndex device, approx_time_t time) : device_(device) { time_.approx_t_ = time; }
  void recordUserMetadata(const std::string &name, std::string value) { metadata_.emplace_back(name, std::move(value)); }
  c10::DeviceIndex device_; trace_time_ time_{}; std::vector<std::pair<std::string, std::string>> metadata_;
};
}
namespace cuda {
using MempoolId_t = std::pair<CaptureId_t, CaptureId_t>;
namespace CUDACachingAllocator {
using c10::CachingDeviceAllocator::TraceEntry;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;
using AllocatorTraceTracker = std::function<void(const TraceEntry &)>;
using CreateContextFn = std::shared_ptr<GatheredContext> (*)();
using OutOfMemoryObserver = std::function<void(int64_t device, size_t allocated, size_t device_total, size_t device_free)>;
struct AllocatorConfigInfo { double garbage_collection_threshold; size_t max_split_size; size_t pinned_num_register_threads; bool expandable_segments; bool release_lock_on_malloc; bool pinned_use_host_register; bool graph_capture_record_stream_reuse; std::string last_allocator_settings; std::vector<size_t> roundup_power2_divisions; };
struct SnapshotInfo { std::vector<SegmentInfo> segments; std::vector<std::vector<TraceEntry>> device_traces; std::vector<c10::CachingDeviceAllocator::AnnotationEntry> external_annotations; AllocatorConfigInfo config_metadata; };
struct AllocatorState { virtual ~AllocatorState() = default; };
struct CheckpointDelta { std::vector<void *> ptrs_freed; std::vector<c10::DataPtr> dataptrs_allocd; };
struct ShareableHandle { ptrdiff_t offset; std::string handle; };
class CUDAAllocator : public c10::Allocator {
 public:
  virtual void *raw_alloc(size_t nbytes) = 0;
  virtual void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) = 0;
  virtual void raw_delete(void *ptr) = 0;
  virtual void init(int device_count) = 0;
  virtual bool initialized() = 0;
  virtual double getMemoryFraction(c10::DeviceIndex device) = 0;
  virtual void setMemoryFraction(double fraction, c10::DeviceIndex device) = 0;
  virtual void emptyCache(MempoolId_t mempool_id = {0, 0}) = 0;
  virtual void enable(bool value) = 0;
  virtual bool isEnabled() const = 0;
  virtual void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) = 0;
  virtual void *getBaseAllocation(void *ptr, size_t *size) = 0;
  virtual void recordStream(const DataPtr &, CUDAStream stream) = 0;
  virtual DeviceStats getDeviceStats(c10::DeviceIndex device) = 0;
  virtual void resetAccumulatedStats(c10::DeviceIndex device) = 0;
  virtual void resetPeakStats(c10::DeviceIndex device) = 0;
  virtual SnapshotInfo snapshot(MempoolId_t mempool_id = {0, 0}, bool include_traces = true) = 0;
  virtual void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id, std::function<bool(cudaStream_t)> filter) = 0;
  virtual void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) = 0;
  virtual void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) = 0;
  virtual int getPoolUseCount(c10::DeviceIndex, MempoolId_t) { return 0; }
  virtual void createOrIncrefPool(c10::DeviceIndex, MempoolId_t, std::shared_ptr<CUDAAllocator> = nullptr) {}
  virtual void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool) {}
  virtual void setNoSplit(c10::DeviceIndex, MempoolId_t) {}
  virtual bool checkPoolLiveAllocations(c10::DeviceIndex, MempoolId_t, const std::unordered_set<void *> &) { return false; }
  virtual ShareableHandle shareIpcHandle(void *ptr) = 0;
  virtual std::shared_ptr<void> getIpcDevPtr(std::string handle) = 0;
  virtual bool isHistoryEnabled() { return false; }
  virtual void recordHistory(bool enabled, CreateContextFn context_recorder, size_t alloc_trace_max_entries, RecordContext when, bool clearHistory, const std::vector<std::string> &skip_actions) = 0;
  virtual void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &) {}
  virtual void setUserMetadata(const std::string &) {}
  virtual std::string getUserMetadata() { return ""; }
  virtual void attachOutOfMemoryObserver(OutOfMemoryObserver observer) = 0;
  virtual void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) = 0;
  virtual void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) = 0;
  virtual cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count, cudaStream_t stream, bool p2p_enabled) = 0;
  virtual std::shared_ptr<AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) = 0;
  virtual CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<AllocatorState> pps) = 0;
  virtual std::string name() = 0;
};
CUDAAllocator *get();
struct CUDAAllocatorConfig { static size_t pinned_num_register_threads(); static bool release_lock_on_cudamalloc(); static bool pinned_use_cuda_host_register(); static bool graph_capture_record_stream_reuse(); };
}
}
}
