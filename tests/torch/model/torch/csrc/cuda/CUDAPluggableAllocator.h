// A model of PyTorch's <torch/csrc/cuda/CUDAPluggableAllocator.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/cuda/CUDACachingAllocator.h>
#include <mutex>
#include <unordered_map>
namespace torch::cuda::CUDAPluggableAllocator {
using streamType = cudaStream_t;
struct CUDAPluggableAllocator : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
  CUDAPluggableAllocator(std::function<void *(size_t, int, cudaStream_t)> alloc_fn, std::function<void(void *, size_t, int, cudaStream_t)> free_fn);
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void *raw_alloc(size_t) override; void *raw_alloc_with_stream(size_t, cudaStream_t) override; void raw_delete(void *) override;
  void init(int) override; bool initialized() override; double getMemoryFraction(c10::DeviceIndex) override;
  void setMemoryFraction(double, c10::DeviceIndex) override; void emptyCache(c10::cuda::MempoolId_t = {0, 0}) override;
  void enable(bool) override; bool isEnabled() const override; void cacheInfo(c10::DeviceIndex, size_t *) override;
  void *getBaseAllocation(void *, size_t *) override; void recordStream(const c10::DataPtr &, c10::cuda::CUDAStream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override; void resetAccumulatedStats(c10::DeviceIndex) override;
  void resetPeakStats(c10::DeviceIndex) override; c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot(c10::cuda::MempoolId_t, bool) override;
  void beginAllocateToPool(c10::DeviceIndex, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) override;
  void endAllocateToPool(c10::DeviceIndex, c10::cuda::MempoolId_t) override; void releasePool(c10::DeviceIndex, c10::cuda::MempoolId_t) override;
  c10::cuda::CUDACachingAllocator::ShareableHandle shareIpcHandle(void *) override; std::shared_ptr<void> getIpcDevPtr(std::string) override;
  void recordHistory(bool, c10::cuda::CUDACachingAllocator::CreateContextFn, size_t, c10::CachingDeviceAllocator::RecordContext, bool, const std::vector<std::string> &) override;
  void attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver) override;
  void attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker) override;
  void enablePeerAccess(c10::DeviceIndex, c10::DeviceIndex) override;
  cudaError_t memcpyAsync(void *, int, const void *, int, size_t, cudaStream_t, bool) override;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(c10::DeviceIndex, c10::cuda::MempoolId_t) override;
  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState>) override;
  std::string name() override;
 protected:
  std::function<void *(size_t, int, cudaStream_t)> alloc_fn_;
  std::function<void(void *, size_t, int, cudaStream_t)> free_fn_;
  std::mutex sizes_mutex_;
  std::unordered_map<void *, size_t> sizes_;
  bool initialized_ = false;
};
void changeCurrentAllocator(const std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> &allocator);
}
