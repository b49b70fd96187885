// test_torch_adapter.cpp -- the torch adapter's own logic, without PyTorch and without a GPU.
//
// python/gpumem/torch_adapter.cpp is compiled here against tests/torch/model (PyTorch's headers as the
// adapter uses them) and model_runtime.cpp (their functions, as PyTorch behaves in these cases), and its
// gpumem allocators run on the cuda backend over tests/fake_cuda.c. What is checked is what the adapter
// itself decides, in the calls PyTorch makes: which allocator serves a request (a MemPool with an
// allocator of its own, a private pool, the device), when a MemPool's memory goes back to its allocator,
// which statistics the device reports, what the profiler, the GPU trace and the history are told, and
// out of memory. Whether PyTorch makes those calls as modelled is for the conformance suite on the GPU
// (tests/gpu/test_torch_conformance.py), which runs the same behaviours under native and under gpumem.
#include "torch_adapter.cpp" // the adapter's class lives in that file's anonymous namespace

#include "model_runtime.h"
#include "test.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

using c10::cuda::MempoolId_t;
using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

GpumemAllocator &adapter() { return *installed; }

int64_t live_allocations() { return adapter().getDeviceStats(0).allocation[0].current; }

// A MemPool's allocator of its own (NCCL's ncclMemAlloc, say), as torch.cuda.memory.CUDAPluggableAllocator
// makes one: host memory here, its segments remembered.
struct Source {
  std::map<char *, size_t> segments;
  int given_back = 0;
  std::shared_ptr<CUDAPluggableAllocator> allocator = std::make_shared<CUDAPluggableAllocator>(
      [this](size_t size, int, cudaStream_t) {
        char *segment = static_cast<char *>(std::aligned_alloc(512, (size + 511) / 512 * 512));
        segments[segment] = size;
        return static_cast<void *>(segment);
      },
      [this](void *segment, size_t, int, cudaStream_t) {
        segments.erase(static_cast<char *>(segment));
        given_back++;
        std::free(segment);
      });

  bool holds(const void *pointer) const {
    for (const auto &[segment, size] : segments)
      if (pointer >= segment && static_cast<const char *>(pointer) < segment + size)
        return true;
    return false;
  }
};

bool accept_every_stream(cudaStream_t) { return true; }

// torch.cuda.use_mem_pool's calls around its block, in two halves.
void begin_use(MempoolId_t id) { adapter().beginAllocateToPool(0, id, accept_every_stream); }
void end_use(MempoolId_t id) {
  adapter().endAllocateToPool(0, id);
  adapter().releasePool(0, id);
}

// One allocation inside `with use_mem_pool(pool)`.
void *allocate_in(MempoolId_t id, size_t size) {
  begin_use(id);
  void *pointer = adapter().raw_alloc(size);
  end_use(id);
  return pointer;
}

// MemPool's destructor.
void destroy_mem_pool(MempoolId_t id) {
  adapter().releasePool(0, id);
  adapter().emptyCache(id);
}

// Before the device's allocator exists (the first test): the fraction waits for it, as native's, which
// makes no CUDA context for a fraction; once made, the allocator's limit is that fraction of the device.
void a_fraction_set_before_the_first_allocation() {
  REQUIRE(adapter().existing(0) == nullptr);
  adapter().setMemoryFraction(0.25, 0);
  CHECK(adapter().existing(0) == nullptr);
  CHECK(adapter().getMemoryFraction(0) == 0.25);
  bool raised = false;
  try {
    adapter().raw_alloc(size_t(300) << 20); // more than a quarter of the fake device's 1 GiB
  } catch (const c10::OutOfMemoryError &) {
    raised = true;
  }
  CHECK(raised);
  CHECK(adapter().existing(0) != nullptr);
  CHECK(adapter().getMemoryFraction(0) > 0.24 && adapter().getMemoryFraction(0) <= 0.25);
  adapter().setMemoryFraction(1.0, 0);
  void *pointer = adapter().raw_alloc(size_t(300) << 20);
  CHECK(pointer != nullptr);
  adapter().raw_delete(pointer);
  bool refused = false;
  try {
    adapter().setMemoryFraction(1.5, 0);
  } catch (const c10::Error &) {
    refused = true;
  }
  CHECK(refused);
}

void allocations_through_data_pointers() {
  int64_t before = live_allocations();
  c10::DataPtr data = adapter().allocate(1000);
  REQUIRE(data.get() != nullptr);
  c10::CachingDeviceAllocator::DeviceStats stats = adapter().getDeviceStats(0);
  CHECK_EQ_INT(stats.allocation[0].current, before + 1);
  CHECK_EQ_INT(stats.requested_bytes[0].current, 1000);
  CHECK(stats.allocated_bytes[0].current >= 1000);
  CHECK(stats.reserved_bytes[0].current >= stats.allocated_bytes[0].current);
  data.get_deleter()(data.get());
  CHECK_EQ_INT(live_allocations(), before);
  CHECK(adapter().allocate(0).get() == nullptr);
  adapter().emptyCache({0, 0}); // torch.cuda.empty_cache(): the memory goes back to the driver
  CHECK_EQ_INT(adapter().getDeviceStats(0).reserved_bytes[0].current, 0);
}

void a_mem_pool_with_an_allocator_of_its_own() {
  Source source;
  MempoolId_t id{0, 101};
  adapter().createOrIncrefPool(0, id, source.allocator);
  CHECK_EQ_INT(adapter().getPoolUseCount(0, id), 1);
  int64_t counted_before = adapter().getDeviceStats(0).allocation[0].allocated;
  void *inside = allocate_in(id, 4096);
  void *outside = adapter().raw_alloc(4096);
  CHECK(source.holds(inside));
  CHECK(!source.holds(outside));
  CHECK_EQ_INT(source.segments.size(), 1);
  CHECK_EQ_INT(adapter().getPoolUseCount(0, id), 1);
  CHECK_EQ_INT(live_allocations(), 2); // the device's statistics include the pool's

  adapter().emptyCache({0, 0}); // a pool in use keeps its segments (NCCL's registrations stay)
  adapter().raw_delete(inside);
  adapter().emptyCache({0, 0});
  CHECK_EQ_INT(source.given_back, 0);

  destroy_mem_pool(id); // released with nothing live: its memory goes back to its allocator
  CHECK_EQ_INT(source.given_back, 1);
  CHECK(source.segments.empty());
  CHECK_EQ_INT(adapter().getPoolUseCount(0, id), 0);
  adapter().raw_delete(outside);
  // The pool's allocation still counts in the device's accumulated statistics.
  CHECK_EQ_INT(adapter().getDeviceStats(0).allocation[0].allocated, counted_before + 2);
}

void a_released_mem_pool_goes_with_its_last_allocation() {
  Source source;
  MempoolId_t id{0, 102};
  adapter().createOrIncrefPool(0, id, source.allocator);
  void *kept = allocate_in(id, 1 << 20);
  destroy_mem_pool(id);
  CHECK_EQ_INT(source.given_back, 0); // its allocation still lives in the segment
  CHECK(source.holds(kept));
  adapter().raw_delete(kept);
  CHECK_EQ_INT(source.given_back, 1);
}

void the_last_route_begun_takes_the_allocation() {
  Source source;
  MempoolId_t sourced{0, 103}, graph_pool{0, 104};
  adapter().createOrIncrefPool(0, sourced, source.allocator);
  adapter().createOrIncrefPool(0, graph_pool, nullptr); // a private pool of gpumem's
  begin_use(sourced);
  begin_use(graph_pool);
  void *inner = adapter().raw_alloc(4096); // the private pool, begun last
  end_use(graph_pool);
  void *outer = adapter().raw_alloc(4096); // back to the MemPool's allocator
  end_use(sourced);
  CHECK(!source.holds(inner));
  CHECK(source.holds(outer));
  CHECK_EQ_INT(adapter().pool_allocations(0, graph_pool).size(), 1);
  begin_use(graph_pool);
  begin_use(sourced);
  void *inner_sourced = adapter().raw_alloc(4096); // now the MemPool's, begun last
  end_use(sourced);
  void *outer_private = adapter().raw_alloc(4096);
  end_use(graph_pool);
  CHECK(source.holds(inner_sourced));
  CHECK(!source.holds(outer_private));
  CHECK_EQ_INT(adapter().pool_allocations(0, graph_pool).size(), 2);
  for (void *pointer : {inner, outer, inner_sourced, outer_private})
    adapter().raw_delete(pointer);
  destroy_mem_pool(sourced);
  destroy_mem_pool(graph_pool);
  CHECK_EQ_INT(source.given_back, 1);
}

void a_pool_that_does_not_split() {
  MempoolId_t id{0, 105};
  adapter().createOrIncrefPool(0, id, nullptr);
  adapter().setNoSplit(0, id);
  CHECK_EQ_INT(adapter().getPoolUseCount(0, id), 1); // the user moved to the pool of its own
  void *pointer = allocate_in(id, 1024);
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot = adapter().snapshot(id, false);
  REQUIRE(snapshot.segments.size() == 1);
  CHECK(snapshot.segments[0].owner_private_pool_id == id);
  CHECK_EQ_INT(snapshot.segments[0].blocks.size(), 1); // one block: the segment was not split
  CHECK(snapshot.segments[0].blocks[0].allocated);
  adapter().raw_delete(pointer);
  destroy_mem_pool(id);
  CHECK(adapter().snapshot(id, false).segments.empty());
}

// A MemPool of gpumem's own private pools that goes (released, nothing live) gives its memory back to the
// device, as native's MemPool destructor does (releasePool, then emptyCache of that pool).
void a_private_pool_gives_its_memory_back_when_gone() {
  adapter().emptyCache({0, 0});
  int64_t reserved = adapter().getDeviceStats(0).reserved_bytes[0].current;
  MempoolId_t id{0, 112};
  adapter().createOrIncrefPool(0, id, nullptr);
  void *pointer = allocate_in(id, 24 << 20);
  CHECK(adapter().getDeviceStats(0).reserved_bytes[0].current >= reserved + (24 << 20));
  adapter().raw_delete(pointer);
  CHECK(adapter().getDeviceStats(0).reserved_bytes[0].current >= reserved + (24 << 20)); // the pool's still
  destroy_mem_pool(id);
  CHECK_EQ_INT(adapter().getDeviceStats(0).reserved_bytes[0].current, reserved);
}

// MemPool(use_on_oom=True) with a pool of its own (no_split here, on the device's memory): an allocation
// that would fail takes the pool's cached memory (given back, then made again by the device's allocator)
// and is no out of memory; without the mark it is. And the other way, as under native's one allocator: a
// pool's allocation that would fail takes the device's cached memory.
bool raises_out_of_memory(size_t size, MempoolId_t pool = {0, 0}) {
  try {
    adapter().raw_delete(pool == MempoolId_t{0, 0} ? adapter().raw_alloc(size) : allocate_in(pool, size));
  } catch (const c10::OutOfMemoryError &) {
    return true;
  }
  return false;
}

void a_mem_pool_marked_use_on_oom_lends_its_free_memory() {
  const size_t size = size_t(600) << 20; // two of them do not fit the fake device's 1 GiB
  adapter().emptyCache({0, 0});
  MempoolId_t id{0, 113};
  adapter().createOrIncrefPool(0, id, nullptr); // MemPool(use_on_oom=True, no_split=True), in native's order
  adapter().setUseOnOOM(0, id, true);
  adapter().setNoSplit(0, id);
  adapter().raw_delete(allocate_in(id, size)); // cached by the pool, which is in use
  REQUIRE(adapter().snapshot(id, false).segments.size() == 1);
  int64_t ooms = adapter().getDeviceStats(0).num_ooms;
  CHECK(!raises_out_of_memory(size));
  CHECK_EQ_INT(adapter().getDeviceStats(0).num_ooms, ooms); // not counted: it did not fail
  CHECK(adapter().snapshot(id, false).segments.empty());   // lent, no longer the pool's
  CHECK(!raises_out_of_memory(size, id)); // the device's cache given back for the pool, which goes on
  adapter().setUseOnOOM(0, id, false); // the pool holds its 600 MiB again
  CHECK(raises_out_of_memory(size));
  CHECK_EQ_INT(adapter().getDeviceStats(0).num_ooms, ooms + 1);
  CHECK_EQ_INT(adapter().snapshot(id, false).segments.size(), 1); // the pool kept its memory
  destroy_mem_pool(id);
}

// The pools' allocators are configured as the device's: GPUMEM_CONF, then install()'s string (main).
void mem_pools_take_the_configuration() {
  Source source;
  MempoolId_t id{0, 107};
  adapter().createOrIncrefPool(0, id, source.allocator);
  void *small = allocate_in(id, 1000), *large = allocate_in(id, 5 << 20);
  std::vector<size_t> sizes;
  for (const auto &[segment, size] : source.segments)
    sizes.push_back(size);
  std::sort(sizes.begin(), sizes.end());
  REQUIRE(sizes.size() == 2);
  CHECK_EQ_INT(sizes[0], 4 << 20);  // small_segment_size:4MiB, from install()
  CHECK_EQ_INT(sizes[1], 40 << 20); // large_segment_size:40MiB, from GPUMEM_CONF
  adapter().raw_delete(small);
  adapter().raw_delete(large);
  destroy_mem_pool(id);
}

void resets_reach_pools_gone() {
  Source source;
  MempoolId_t id{0, 106};
  adapter().createOrIncrefPool(0, id, source.allocator);
  void *pointer = allocate_in(id, 8 << 20);
  adapter().raw_delete(pointer);
  destroy_mem_pool(id);
  c10::CachingDeviceAllocator::DeviceStats stats = adapter().getDeviceStats(0);
  CHECK(stats.allocated_bytes[0].peak >= 8 << 20); // the pool's peak stays the device's
  adapter().resetPeakStats(0);
  adapter().resetAccumulatedStats(0);
  stats = adapter().getDeviceStats(0);
  CHECK_EQ_INT(stats.allocated_bytes[0].peak, stats.allocated_bytes[0].current);
  CHECK_EQ_INT(stats.allocation[0].allocated, 0);
  CHECK_EQ_INT(stats.allocation[0].freed, 0);
}

struct TraceListener final : c10::impl::PyInterpreterVTable {
  mutable std::vector<uintptr_t> allocated, freed;
  void trace_gpu_memory_allocation(c10::DeviceType, uintptr_t address) const override { allocated.push_back(address); }
  void trace_gpu_memory_deallocation(c10::DeviceType, uintptr_t address) const override { freed.push_back(address); }
};

void the_gpu_trace_hears_every_allocation_and_free() {
  TraceListener listener;
  c10::impl::PyInterpreter interpreter{&listener};
  torch_model::gpu_trace = &interpreter;
  void *pointer = adapter().raw_alloc(512);
  adapter().raw_delete(pointer);
  torch_model::gpu_trace = nullptr;
  REQUIRE(listener.allocated.size() == 1 && listener.freed.size() == 1);
  CHECK(listener.allocated[0] == reinterpret_cast<uintptr_t>(pointer));
  CHECK(listener.freed[0] == reinterpret_cast<uintptr_t>(pointer));
}

void the_profiler_is_told_sizes_and_totals() {
  torch_model::profiling = true;
  torch_model::profiler_events.clear();
  void *pointer = adapter().raw_alloc(1000);
  adapter().raw_delete(pointer);
  torch_model::profiling = false;
  REQUIRE(torch_model::profiler_events.size() == 2);
  const torch_model::ProfilerEvent &allocation = torch_model::profiler_events[0], &free = torch_model::profiler_events[1];
  CHECK(allocation.pointer == pointer && free.pointer == pointer);
  CHECK(allocation.size >= 1000);
  CHECK_EQ_INT(free.size, -allocation.size);
  CHECK(allocation.allocated >= static_cast<size_t>(allocation.size));
  CHECK_EQ_INT(free.allocated, allocation.allocated - static_cast<size_t>(allocation.size));
  CHECK(allocation.reserved >= allocation.allocated);
}

void out_of_memory_raises_and_leaves_the_adapter_usable() {
  static int observed = 0; // the observer stays attached after this test
  adapter().attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) { observed++; });
  int64_t ooms = adapter().getDeviceStats(0).num_ooms;
  bool raised = false;
  try {
    adapter().raw_alloc(size_t(64) << 30);
  } catch (const c10::OutOfMemoryError &error) {
    raised = std::string(error.what()).find("out of memory") != std::string::npos;
  }
  CHECK(raised);
  CHECK_EQ_INT(observed, 1);
  CHECK_EQ_INT(adapter().getDeviceStats(0).num_ooms, ooms + 1);
  void *pointer = adapter().raw_alloc(4096);
  CHECK(pointer != nullptr);
  adapter().raw_delete(pointer);
}

// NCCL's registration hook: segments mapped and unmapped (pages engine) reach the trackers, with the
// device and, for a MemPool's allocator, its pool.
std::vector<TraceEntry> &tracked() {
  static std::vector<TraceEntry> entries;
  return entries;
}

void trace_trackers_see_segments() {
  adapter().attachAllocatorTraceTracker([](const TraceEntry &entry) { tracked().push_back(entry); });
  adapter().emptyCache({0, 0});
  tracked().clear();
  void *pointer = adapter().raw_alloc(size_t(64) << 20);
  adapter().raw_delete(pointer);
  adapter().emptyCache({0, 0});
  int maps = 0, unmaps = 0, allocations = 0;
  for (const TraceEntry &entry : tracked()) {
    CHECK_EQ_INT(entry.device_, 0);
    maps += entry.action_ == TraceEntry::SEGMENT_MAP;
    unmaps += entry.action_ == TraceEntry::SEGMENT_UNMAP;
    allocations += entry.action_ == TraceEntry::ALLOC && entry.addr_ == reinterpret_cast<size_t>(pointer);
  }
  CHECK(maps >= 1);
  CHECK(unmaps >= 1);
  CHECK_EQ_INT(allocations, 1);
  Source source; // a MemPool's segments are named with its pool
  MempoolId_t id{0, 108};
  adapter().createOrIncrefPool(0, id, source.allocator);
  tracked().clear();
  void *in_pool = allocate_in(id, 4096);
  bool named = false;
  for (const TraceEntry &entry : tracked())
    named = named || (entry.action_ == TraceEntry::SEGMENT_ALLOC && entry.mempool_ == id);
  CHECK(named);
  adapter().raw_delete(in_pool);
  destroy_mem_pool(id);
}

// torch.compile's cudagraph trees: a graph pool put back to a checkpoint frees what came since and
// makes again, at their addresses, the checkpoint's allocations freed since.
void a_graph_pool_goes_back_to_its_checkpoint() {
  MempoolId_t id{109, 0};
  adapter().createOrIncrefPool(0, id, nullptr);
  void *first = allocate_in(id, 1 << 20), *second = allocate_in(id, 1 << 20);
  auto checkpoint = adapter().getCheckpointState(0, id);
  adapter().raw_delete(first);
  void *third = allocate_in(id, 3 << 20);
  c10::cuda::CUDACachingAllocator::CheckpointDelta delta = adapter().setCheckpointPoolState(0, checkpoint);
  std::set<void *> freed(delta.ptrs_freed.begin(), delta.ptrs_freed.end()), made;
  for (const c10::DataPtr &data : delta.dataptrs_allocd)
    made.insert(data.get());
  CHECK(freed == (std::set<void *>{second, third}));
  CHECK(made == (std::set<void *>{first, second}));
  std::set<void *> now;
  for (const gm_pool_allocation &allocation : adapter().pool_allocations(0, id))
    now.insert(pointer_of(allocation.address));
  CHECK(now == made);
  for (const c10::DataPtr &data : delta.dataptrs_allocd)
    data.get_deleter()(data.get());
  CHECK(adapter().pool_allocations(0, id).empty());
  destroy_mem_pool(id);
}

// torch.compile's cudagraph trees ask whether a graph pool holds exactly the tensors they know to be alive.
void a_graph_pools_live_allocations_are_checked() {
  MempoolId_t id{114, 0};
  adapter().createOrIncrefPool(0, id, nullptr);
  void *first = allocate_in(id, 1 << 20), *second = allocate_in(id, 2 << 20);
  void *outside = adapter().raw_alloc(1 << 20);
  CHECK(adapter().checkPoolLiveAllocations(0, id, {first, second}));
  CHECK(!adapter().checkPoolLiveAllocations(0, id, {first}));
  CHECK(!adapter().checkPoolLiveAllocations(0, id, {first, outside}));
  adapter().raw_delete(second);
  CHECK(adapter().checkPoolLiveAllocations(0, id, {first}));
  adapter().raw_delete(first);
  adapter().raw_delete(outside);
  CHECK(adapter().checkPoolLiveAllocations(0, id, {}));
  destroy_mem_pool(id);
}

// cuDNN sizes its workspaces by cacheInfo: the largest allocation that can be had now, within the
// memory fraction.
void cache_info_answers_what_can_be_had() {
  size_t largest = 0;
  adapter().cacheInfo(0, &largest);
  CHECK(largest >= (size_t(256) << 20)); // most of the fake device's 1 GiB is free
  adapter().setMemoryFraction(0.125, 0);
  adapter().cacheInfo(0, &largest);
  CHECK(largest > 0 && largest <= (size_t(128) << 20));
  adapter().setMemoryFraction(1.0, 0);
}

// caching_allocator_alloc(size, stream) on a stream that is not the current one: the block is that
// stream's (as native's), and freeing it needs no stream of the caller's.
void caching_allocator_alloc_on_another_stream() {
  auto stream = reinterpret_cast<cudaStream_t>(0x1237);
  int64_t live = live_allocations();
  void *pointer = adapter().raw_alloc_with_stream(5 << 20, stream);
  REQUIRE(pointer != nullptr);
  CHECK_EQ_INT(live_allocations(), live + 1);
  bool found = false;
  for (const auto &segment : adapter().snapshot({0, 0}, false).segments)
    if (segment.address <= reinterpret_cast<size_t>(pointer) &&
        reinterpret_cast<size_t>(pointer) < segment.address + segment.total_size)
      found = segment.stream == static_cast<void *>(stream);
  CHECK(found);
  adapter().raw_delete(pointer);
  CHECK_EQ_INT(live_allocations(), live);
}

// record_stream: gpumem's own blocks only; a pointer it does not own is refused, without harm.
void record_stream_and_pointers_that_are_not_gpumems() {
  c10::DataPtr data = adapter().allocate(4096);
  c10::cuda::CUDAStream side(reinterpret_cast<cudaStream_t>(0x1235), 0x1235);
  adapter().recordStream(data, side);
  int64_t live = live_allocations();
  char foreign[64];
  adapter().recordStream(c10::DataPtr(foreign, foreign, nullptr, c10::Device(c10::DeviceType::CUDA, 0)), side);
  bool refused = false;
  try {
    adapter().recordStream(c10::DataPtr(foreign, foreign, &delete_pointer, c10::Device(c10::DeviceType::CUDA, 0)), side);
  } catch (const c10::Error &) {
    refused = true;
  }
  CHECK(refused);
  adapter().raw_delete(foreign); // warned, nothing freed
  CHECK_EQ_INT(live_allocations(), live);
  size_t size = 0;
  CHECK(adapter().getBaseAllocation(data.get(), &size) == data.get());
  CHECK(size >= 4096);
  data.get_deleter()(data.get());
  CHECK_EQ_INT(live_allocations(), live - 1);
}

// torch.multiprocessing's handle of a tensor, opened as a receiving process would (here by this same
// process): the bytes written through the tensor are there through the mapping; one mapping per handle
// while any tensor of it lives; a handle that is not gpumem's and no allocator to open it is refused.
void a_shared_tensor_opens_on_its_bytes() {
  void *pointer = adapter().raw_alloc(3 << 20);
  std::memset(pointer, 0x5a, 3 << 20); // the fake device's memory is the host's
  static_cast<unsigned char *>(pointer)[12345] = 0xc3;
  c10::cuda::CUDACachingAllocator::ShareableHandle handle = adapter().shareIpcHandle(pointer);
  CHECK(!handle.handle.empty());
  {
    std::shared_ptr<void> opened = adapter().getIpcDevPtr(handle.handle);
    REQUIRE(opened != nullptr);
    const unsigned char *bytes = static_cast<const unsigned char *>(opened.get()) + handle.offset;
    CHECK(bytes != pointer); // a second mapping of the same memory
    CHECK_EQ_INT(bytes[0], 0x5a);
    CHECK_EQ_INT(bytes[12345], 0xc3);
    CHECK_EQ_INT(bytes[(3 << 20) - 1], 0x5a);
    CHECK(adapter().getIpcDevPtr(handle.handle) == opened); // mapped once while it lives
  }
  bool refused = false;
  try {
    adapter().getIpcDevPtr(std::string(1, 2) + "c, a handle of cudaMalloc's memory");
  } catch (const c10::Error &error) {
    refused = std::string(error.what()).find("cannot open this CUDA IPC handle") != std::string::npos;
  }
  CHECK(refused);
  adapter().raw_delete(pointer);
}

struct Stack final : c10::GatheredContext {};
std::shared_ptr<c10::GatheredContext> gather_stack() { return std::make_shared<Stack>(); }

void a_free_carries_its_allocations_stack_in_alloc_mode() {
  using c10::CachingDeviceAllocator::RecordContext;
  adapter().recordHistory(true, gather_stack, 1000, RecordContext::ALLOC, true, {});
  void *pointer = adapter().raw_alloc(2048);
  adapter().raw_delete(pointer);
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot = adapter().snapshot({0, 0}, true);
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
  REQUIRE(!snapshot.device_traces.empty());
  std::shared_ptr<c10::GatheredContext> allocated, freed;
  for (const TraceEntry &entry : snapshot.device_traces[0]) {
    if (entry.addr_ != reinterpret_cast<size_t>(pointer))
      continue;
    if (entry.action_ == TraceEntry::ALLOC)
      allocated = entry.context_;
    if (entry.action_ == TraceEntry::FREE_REQUESTED)
      freed = entry.context_;
  }
  CHECK(allocated != nullptr);
  CHECK(freed == allocated);
}

// Recording begun again (clear_history) keeps the stacks of blocks allocated before, in snapshots' blocks
// and for their frees; stopping it forgets them, as native's.
void blocks_keep_their_stacks_when_recording_begins_again() {
  using c10::CachingDeviceAllocator::RecordContext;
  adapter().recordHistory(true, gather_stack, 100, RecordContext::ALLOC, true, {});
  void *kept = adapter().raw_alloc(2048);
  adapter().recordHistory(true, gather_stack, 100, RecordContext::ALLOC, true, {});
  auto stack_of_block = [](void *pointer) {
    std::shared_ptr<c10::GatheredContext> stack;
    for (const auto &segment : adapter().snapshot({0, 0}, false).segments) {
      size_t address = segment.address;
      for (const auto &block : segment.blocks) {
        if (address == reinterpret_cast<size_t>(pointer))
          stack = block.context_when_allocated;
        address += block.size;
      }
    }
    return stack;
  };
  std::shared_ptr<c10::GatheredContext> stack = stack_of_block(kept);
  CHECK(stack != nullptr);
  adapter().raw_delete(kept);
  std::shared_ptr<c10::GatheredContext> freed;
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot = adapter().snapshot({0, 0}, true);
  for (const TraceEntry &entry : snapshot.device_traces.at(0))
    if (entry.action_ == TraceEntry::FREE_REQUESTED && entry.addr_ == reinterpret_cast<size_t>(kept))
      freed = entry.context_;
  CHECK(freed == stack);
  void *forgotten = adapter().raw_alloc(2048);
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
  adapter().recordHistory(true, gather_stack, 100, RecordContext::ALLOC, true, {});
  CHECK(stack_of_block(forgotten) == nullptr);
  adapter().raw_delete(forgotten);
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
}

// A device's trace joins its MemPools' events to its own, in time order, and keeps at most as many as
// torch asked for (native keeps one ring per device), the newest.
void a_merged_trace_keeps_the_newest_entries() {
  using c10::CachingDeviceAllocator::RecordContext;
  adapter().recordHistory(true, gather_stack, 6, RecordContext::ALLOC, true, {});
  Source source;
  MempoolId_t id{0, 110};
  adapter().createOrIncrefPool(0, id, source.allocator);
  void *in_pool = allocate_in(id, 4096);
  void *last = nullptr;
  for (int i = 0; i < 4; i++) {
    last = adapter().raw_alloc(8192);
    adapter().raw_delete(last);
  }
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot = adapter().snapshot({0, 0}, true);
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
  REQUIRE(!snapshot.device_traces.empty());
  const std::vector<TraceEntry> &trace = snapshot.device_traces[0];
  CHECK_EQ_INT(trace.size(), 6);
  for (size_t i = 1; i < trace.size(); i++)
    CHECK(trace[i - 1].time_.t_ <= trace[i].time_.t_);
  CHECK(!trace.empty() && trace.back().addr_ == reinterpret_cast<size_t>(last));
  adapter().raw_delete(in_pool);
  destroy_mem_pool(id);
}

// A MemPool destroyed while torch records keeps its events in its device's trace, as native's.
void a_destroyed_mem_pools_events_stay_in_the_trace() {
  using c10::CachingDeviceAllocator::RecordContext;
  adapter().recordHistory(true, gather_stack, 100, RecordContext::ALLOC, true, {});
  Source source;
  MempoolId_t id{0, 111};
  adapter().createOrIncrefPool(0, id, source.allocator);
  void *in_pool = allocate_in(id, 4096);
  adapter().raw_delete(in_pool);
  destroy_mem_pool(id);
  REQUIRE(source.given_back == 1);
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot = adapter().snapshot({0, 0}, true);
  int allocations = 0, segments_freed = 0;
  for (const TraceEntry &entry : snapshot.device_traces.at(0)) {
    allocations += entry.action_ == TraceEntry::ALLOC && entry.addr_ == reinterpret_cast<size_t>(in_pool) &&
                   entry.mempool_ == id && entry.context_ != nullptr;
    segments_freed += entry.action_ == TraceEntry::SEGMENT_FREE && entry.mempool_ == id;
  }
  CHECK_EQ_INT(allocations, 1);
  CHECK_EQ_INT(segments_freed, 1);
  adapter().recordHistory(true, gather_stack, 100, RecordContext::ALLOC, true, {}); // begun anew: forgotten
  bool forgotten = true;
  snapshot = adapter().snapshot({0, 0}, true);
  for (const TraceEntry &entry : snapshot.device_traces.at(0))
    forgotten = forgotten && entry.mempool_ != id;
  CHECK(forgotten);
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
}

void caching_off_gives_each_allocation_its_own_cuda_malloc() {
  adapter().enable(false);
  void *pointer = adapter().raw_alloc(100);
  CHECK_EQ_INT(torch_model::uncached_allocations, 1);
  CHECK(adapter().raw_deleter() != &delete_pointer);
  adapter().raw_delete(pointer);
  CHECK_EQ_INT(torch_model::uncached_allocations, 0);
  adapter().enable(true);
  CHECK(adapter().raw_deleter() == &delete_pointer);
}

// Python threads: each makes MemPools of its own (one with an allocator of its own, one of gpumem's
// private pools), allocates into them through its thread's filter, as use_mem_pool does, and destroys
// them, while the others allocate on the device and torch reads statistics, takes snapshots with history
// recorded and a trace tracker attached, and empties the cache. Under ThreadSanitizer (ctest -L threads)
// a data race fails the test; everywhere, every allocation must end where its route says.
void threads_with_mem_pools_of_their_own() {
  using c10::CachingDeviceAllocator::RecordContext;
  adapter().recordHistory(true, gather_stack, 200, RecordContext::ALLOC, true, {});
  std::atomic<int> misplaced{0}, failed{0};
  auto worker = [&](int index) {
    for (int round = 0; round < 50; round++) {
      try {
        Source source;
        auto thread = std::this_thread::get_id();
        auto this_thread = [thread](cudaStream_t) { return std::this_thread::get_id() == thread; };
        MempoolId_t sourced{0, 1000 + static_cast<unsigned long long>(index * 100 + round)};
        MempoolId_t graph_pool{2000 + static_cast<unsigned long long>(index * 100 + round), 0};
        adapter().createOrIncrefPool(0, sourced, source.allocator);
        adapter().createOrIncrefPool(0, graph_pool, nullptr);
        adapter().beginAllocateToPool(0, sourced, this_thread);
        void *in_sourced = adapter().raw_alloc(4096 * (1 + round % 3));
        adapter().beginAllocateToPool(0, graph_pool, this_thread);
        void *in_graph_pool = adapter().raw_alloc(1 << 20);
        end_use(graph_pool);
        end_use(sourced);
        void *on_device = adapter().raw_alloc(1 << 16);
        misplaced += !source.holds(in_sourced) + source.holds(in_graph_pool) + source.holds(on_device);
        misplaced += adapter().pool_allocations(0, graph_pool).size() != 1;
        for (void *pointer : {in_sourced, in_graph_pool, on_device})
          adapter().raw_delete(pointer);
        destroy_mem_pool(sourced);
        destroy_mem_pool(graph_pool);
        misplaced += source.given_back != 1;
      } catch (const std::exception &error) {
        std::fprintf(stderr, "thread %d: %s\n", index, error.what());
        failed++;
      }
    }
  };
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      adapter().getDeviceStats(0);
      adapter().snapshot({0, 0}, true);
      adapter().emptyCache({0, 0});
    }
  });
  std::vector<std::thread> workers;
  for (int index = 0; index < 4; index++)
    workers.emplace_back(worker, index);
  for (std::thread &each : workers)
    each.join();
  done.store(true);
  reader.join();
  adapter().recordHistory(false, nullptr, 0, RecordContext::NEVER, true, {});
  CHECK_EQ_INT(failed.load(), 0);
  CHECK_EQ_INT(misplaced.load(), 0);
  CHECK_EQ_INT(live_allocations(), 0);
}

} // namespace

int main() {
  setenv("GPUMEM_CONF", "large_segment_size:40MiB", 1);
  setenv("GPUMEM_FAKE_CUDA_EXPORT", "1", 1); // chunks that can be shared with another process
  install("publish:false,small_segment_size:4MiB");
  REQUIRE(torch_model::current_allocator.get() == installed.get());
  static const test_case cases[] = {
      TEST_CASE(a_fraction_set_before_the_first_allocation),
      TEST_CASE(allocations_through_data_pointers),
      TEST_CASE(a_mem_pool_with_an_allocator_of_its_own),
      TEST_CASE(a_released_mem_pool_goes_with_its_last_allocation),
      TEST_CASE(the_last_route_begun_takes_the_allocation),
      TEST_CASE(a_pool_that_does_not_split),
      TEST_CASE(a_private_pool_gives_its_memory_back_when_gone),
      TEST_CASE(a_mem_pool_marked_use_on_oom_lends_its_free_memory),
      TEST_CASE(mem_pools_take_the_configuration),
      TEST_CASE(resets_reach_pools_gone),
      TEST_CASE(the_gpu_trace_hears_every_allocation_and_free),
      TEST_CASE(the_profiler_is_told_sizes_and_totals),
      TEST_CASE(out_of_memory_raises_and_leaves_the_adapter_usable),
      TEST_CASE(a_free_carries_its_allocations_stack_in_alloc_mode),
      TEST_CASE(blocks_keep_their_stacks_when_recording_begins_again),
      TEST_CASE(a_merged_trace_keeps_the_newest_entries),
      TEST_CASE(a_destroyed_mem_pools_events_stay_in_the_trace),
      TEST_CASE(caching_off_gives_each_allocation_its_own_cuda_malloc),
      TEST_CASE(trace_trackers_see_segments),
      TEST_CASE(a_graph_pool_goes_back_to_its_checkpoint),
      TEST_CASE(a_graph_pools_live_allocations_are_checked),
      TEST_CASE(cache_info_answers_what_can_be_had),
      TEST_CASE(caching_allocator_alloc_on_another_stream),
      TEST_CASE(record_stream_and_pointers_that_are_not_gpumems),
      TEST_CASE(a_shared_tensor_opens_on_its_bytes),
      TEST_CASE(threads_with_mem_pools_of_their_own),
  };
  return run_tests(cases, sizeof cases / sizeof cases[0]);
}
