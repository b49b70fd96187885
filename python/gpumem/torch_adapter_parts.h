// torch_adapter_parts.h -- the small pieces torch_adapter.cpp's allocator class is built from: an
// array of one value per device, the stream filter of a pool being allocated to and the C callback that
// asks it, pool ids as gpumem's, the unused functions CUDAPluggableAllocator is made with, a graph
// pool's checkpoint, the current device, addresses as pointers, borrowed streams, a memory fraction as
// a limit, statistics as torch's, whether the configuration names publish, and the MemPools' allocators
// connected to the trace trackers and the history. Included by
// torch_adapter.cpp inside its anonymous namespace, after its includes and using-declarations: it is a
// part of that file, not a header of its own.
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

// A stream PyTorch did not make (torch.cuda.ExternalStream: its id is the handle itself, an even
// number; PyTorch's own have odd ids, the default stream 0): its owner may destroy it while memory
// freed on it is still cached or its tensors live, which PyTorch's allocator allows, since it never
// calls the driver on a tensor's stream later. gpumem is told so and never names it either.
bool is_borrowed(const c10::cuda::CUDAStream &stream) {
  c10::StreamId id = stream.id();
  return id != 0 && (id & 1) == 0;
}

void apply_fraction(gm_allocator *allocator, double fraction) {
  gm_device_info info;
  gm_get_device_info(allocator, &info);
  // gpumem's limit 0 means the whole device: a fraction of no bytes (0, or one that rounds to 0) is a
  // limit of one byte, under which nothing fits, as native's.
  uint64_t limit = static_cast<uint64_t>(fraction * static_cast<double>(info.total_bytes));
  gm_set_memory_limit(allocator, limit ? limit : 1);
}

// gpumem's statistic as torch's.
void copy_statistic(c10::CachingDeviceAllocator::StatArray &to, const gm_stat from[GM_POOL_COUNT]) {
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

// Whether install()'s configuration or GPUMEM_CONF says whether to publish.
bool mentions_publish(const std::string &config) {
  const char *environment = std::getenv("GPUMEM_CONF");
  return config.find("publish:") != std::string::npos ||
         (environment && std::string(environment).find("publish:") != std::string::npos);
}

// The MemPools' allocators made and destroyed, told to the trace trackers and to the history.
void connect_pools(gpumem_pools::SourcedPools &pools, gpumem_trace::Observers &observers, gpumem_trace::History &history) {
  pools.on_made = [&observers, &history](gm_allocator *pool, c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    observers.watch(pool, device, id);
    history.adopt_pool(pool);
  };
  pools.on_destroying = [&observers, &history](gm_allocator *pool, c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    observers.retire(pool);
    history.retire_pool(pool, device, id);
  };
  pools.on_destroyed = [&observers](gm_allocator *pool) { observers.forget(pool); };
}
