// torch_adapter_parts.h -- the small pieces torch_adapter.cpp's allocator class is built from: an
// array of one value per device, the stream filter of a pool being allocated to and the C callback that asks it, pool ids as gpumem's,
// the unused functions CUDAPluggableAllocator is made with, a graph pool's checkpoint, the current
// device, and addresses as pointers. Included by torch_adapter.cpp inside its anonymous namespace,
// after its includes and using-declarations: it is a part of that file, not a header of its own.
#pragma once

using StreamFilter = std::function<bool(cudaStream_t)>;

std::array<double, kMaxDevices> filled(double value) {
  std::array<double, kMaxDevices> values;
  values.fill(value);
  return values;
}

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
