// torch_pool_sources.h -- MemPools whose memory comes from an allocator of their own
// (torch.cuda.MemPool(allocator=...)), under gpumem.
//
// PyTorch lets a memory pool take its memory from another allocator, a CUDAPluggableAllocator: NCCL's
// ncclMemAlloc for buffers registered with NCCL, or an allocator that can release and restore its
// memory on demand (vLLM's sleep mode). The pool's caching allocator still caches that memory in
// segments, and only allocations routed to the pool (use_mem_pool) use it. gpumem does the same with a
// gm_allocator per such pool whose segments come from the pool's allocator (gm_create_with_source, the
// segments engine): its allocations are routed here before the device's allocator is asked, its
// statistics and segments are added to the device's, empty_cache gives its cached segments back to
// that allocator, and once PyTorch releases the pool and no allocation of it is left, it is destroyed.
// Marked use_on_oom, it gives its cached segments back when an allocation of the device would otherwise
// run out of memory (set_use_on_oom).
//
// A MemPool(no_split=True) (symmetric memory, registered with NCCL segment by segment) is served the
// same way, by a gm_allocator of its own whose blocks are never split (the segments engine with
// split_blocks:false), on the device's memory or on its own allocator's.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpumem.h"

namespace gpumem_pools {

using c10::cuda::CUDACachingAllocator::CUDAAllocator;
using Filter = std::function<bool(cudaStream_t)>;

struct SourcedPool {
  c10::DeviceIndex device;
  c10::cuda::MempoolId_t id;
  std::shared_ptr<CUDAAllocator> source; // NULL: the device's memory
  gm_allocator *allocator = nullptr;
  int users = 0;
  bool unsplit = false;
  class SourcedPools *owner = nullptr;
};

// The pool's allocator hands out a segment, on the pool's device. Called with gpumem's lock held.
inline gm_status allocate_from(void *context, uint64_t size, void **address_out) {
  auto *pool = static_cast<SourcedPool *>(context);
  try {
    c10::cuda::CUDAGuard guard(pool->device);
    *address_out = pool->source->raw_alloc(size);
    return *address_out ? GM_OK : GM_ERROR_OUT_OF_MEMORY;
  } catch (const c10::OutOfMemoryError &) {
    return GM_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &) {
    return GM_ERROR_DEVICE;
  }
}

inline void give_back_to(void *context, void *address, uint64_t /*size*/) {
  auto *pool = static_cast<SourcedPool *>(context);
  try {
    c10::cuda::CUDAGuard guard(pool->device);
    pool->source->raw_delete(address);
  } catch (const std::exception &error) {
    TORCH_WARN("gpumem: the memory pool's allocator could not take back a segment: ", error.what());
  }
}

class SourcedPools {
 public:
  // `user_config`: install()'s configuration string, which the pools' allocators take too (make_allocator).
  explicit SourcedPools(std::string user_config) : user_config_(std::move(user_config)) {}

  // A user of pool `id` (createOrIncrefPool with an allocator); its gm_allocator is made with the first.
  void add_user(c10::DeviceIndex device, c10::cuda::MempoolId_t id, std::shared_ptr<CUDAAllocator> source) {
    std::lock_guard<std::mutex> guard(mutex_);
    SourcedPool *pool = find(device, id);
    if (!pool) {
      pools_.push_back(SourcedPool{device, id, std::move(source)});
      pool = &pools_.back();
      make_allocator(*pool, [this] { pools_.pop_back(); });
    }
    pool->users++;
  }

  // MemPool(no_split=True), told after the pool was made and before it is used: a pool of this kind
  // gets an allocator that does not split anew; a pool of gpumem's own private pools (with `users`,
  // given up there by the caller) becomes one of this kind, on the device's memory.
  void make_unsplit(c10::DeviceIndex device, c10::cuda::MempoolId_t id, int users, gm_allocator *device_allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (marked_.count({device, id})) // use_on_oom is set before no_split
      lend_for(device, device_allocator);
    SourcedPool *pool = find(device, id);
    if (!pool) {
      pools_.push_back(SourcedPool{device, id, nullptr, nullptr, users, true});
      make_allocator(pools_.back(), [this] { pools_.pop_back(); });
      return;
    }
    gm_stats stats;
    TORCH_CHECK(gm_get_stats(pool->allocator, &stats) == GM_OK && stats.allocation[GM_POOL_ALL].current == 0,
                "gpumem: no_split must be set before the memory pool is used");
    destroy_allocator(*pool);
    pool->unsplit = true;
    auto position = std::find_if(pools_.begin(), pools_.end(), [pool](const SourcedPool &each) { return &each == pool; });
    make_allocator(*pool, [this, position] { pools_.erase(position); }); // the MemPool is not made: nor its pool
  }

  bool has(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    if (!count_.load(std::memory_order_acquire))
      return false;
    std::lock_guard<std::mutex> guard(mutex_);
    return find(device, id) != nullptr;
  }

  int users(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    std::lock_guard<std::mutex> guard(mutex_);
    SourcedPool *pool = find(device, id);
    return pool ? pool->users : 0;
  }

  // Allocations on the streams `filter` accepts go to the pool until end_routing (use_mem_pool). Like
  // native's beginAllocateToPool it adds a user, which the releasePool after endAllocateToPool takes
  // away (use_mem_pool and graph captures pair them so).
  void begin_routing(c10::DeviceIndex device, c10::cuda::MempoolId_t id, Filter filter, uint64_t begun) {
    std::lock_guard<std::mutex> guard(mutex_);
    SourcedPool *pool = find(device, id);
    pool->users++;
    routes_.push_back(Route{pool, std::move(filter), begun});
    routing_.store(static_cast<int>(routes_.size()), std::memory_order_release);
  }

  void end_routing(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto route = routes_.begin(); route != routes_.end(); ++route)
      if (route->pool->device == device && route->pool->id == id) {
        routes_.erase(route);
        break;
      }
    routing_.store(static_cast<int>(routes_.size()), std::memory_order_release);
  }

  // The allocator of the latest route that takes an allocation on `stream`, and when that route was
  // begun into *begun; NULL (at the cost of one atomic load) when no pool of this kind is allocated to.
  gm_allocator *route(c10::DeviceIndex device, cudaStream_t stream, uint64_t *begun) {
    if (!routing_.load(std::memory_order_acquire))
      return nullptr;
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto route = routes_.rbegin(); route != routes_.rend(); ++route)
      if (route->pool->device == device && (!route->filter || route->filter(stream))) {
        *begun = route->begun;
        return route->pool->allocator;
      }
    return nullptr;
  }

  // MemPool(use_on_oom=...) (setUseOnOOM, which its destructor calls with false), for a pool of any kind:
  // one of gpumem's private pools may become one of these later (no_split, set after use_on_oom). Native
  // lets an allocation that would fail take such a pool's free blocks; as gpumem's private pools lend
  // theirs (gm_set_pool_use_on_oom), a pool of this kind gives its cached segments back to its allocator
  // instead (ncclMemAlloc's, vLLM's: memory of the device) and the device's allocator tries again. That
  // runs in a pressure callback on `device_allocator` (registered once: lend_for), which the allocator
  // calls with level CRITICAL, no lock held, when an allocation would fail after its own retries, and
  // then tries the allocation once more. Whether the pool is one of these (else gpumem's private pools
  // keep the mark too: gm_set_pool_use_on_oom).
  bool set_use_on_oom(c10::DeviceIndex device, c10::cuda::MempoolId_t id, bool use_on_oom, gm_allocator *device_allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    bool ours = find(device, id) != nullptr;
    if (!use_on_oom)
      marked_.erase({device, id});
    else
      marked_.insert({device, id});
    if (use_on_oom && ours)
      lend_for(device, device_allocator);
    return ours;
  }

  // The pool allocator that owns `pointer`; NULL when there is none.
  gm_allocator *owner(const void *pointer) {
    if (!count_.load(std::memory_order_acquire))
      return nullptr;
    std::lock_guard<std::mutex> guard(mutex_);
    for (SourcedPool &pool : pools_)
      if (gm_owns(pool.allocator, pointer))
        return pool.allocator;
    return nullptr;
  }

  // PyTorch is done with one user of the pool (a MemPool's destructor).
  void release(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (SourcedPool *pool = find(device, id))
      pool->users--;
    sweep();
  }

  // empty_cache (all pools, `only` NULL) or emptyCache(id) (a MemPool's destructor, after releasePool: pool
  // *only): as native's, only pools PyTorch released (their last allocations still live) give their cached
  // segments back to their allocators; pools in use keep them (NCCL's registered segments stay).
  void empty_cache(const c10::cuda::MempoolId_t *only = nullptr) {
    if (!count_.load(std::memory_order_seq_cst))
      return;
    std::lock_guard<std::mutex> guard(mutex_);
    for (SourcedPool &pool : pools_)
      if ((!only || pool.id == *only) && pool.users <= 0)
        gm_empty_cache(pool.allocator);
    sweep();
  }

  // The device of a pool's allocator (`otherwise` if it is no pool's).
  c10::DeviceIndex device_of(gm_allocator *allocator, c10::DeviceIndex otherwise) {
    std::lock_guard<std::mutex> guard(mutex_);
    for (const SourcedPool &pool : pools_)
      if (pool.allocator == allocator)
        return pool.device;
    return otherwise;
  }

  // A freed allocation may have been a released pool's last.
  void after_free(gm_allocator *allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    bool released = false;
    for (const SourcedPool &pool : pools_)
      released = released || (pool.allocator == allocator && pool.users <= 0);
    if (released)
      sweep();
  }

  // visit(allocator, pool id) for each pool on `device`.
  template <typename Visit> void for_each_pool(c10::DeviceIndex device, Visit visit) {
    if (!count_.load(std::memory_order_seq_cst))
      return;
    std::lock_guard<std::mutex> guard(mutex_);
    for (SourcedPool &pool : pools_)
      if (pool.device == device)
        visit(pool.allocator, pool.id);
  }

  // Told of each pool allocator made and destroyed (the adapter's trace trackers watch them); set once,
  // before any pool is made, and called with this object's lock held.
  std::function<void(gm_allocator *, c10::DeviceIndex, c10::cuda::MempoolId_t)> on_made, on_destroying;
  std::function<void(gm_allocator *)> on_destroyed;
  // The device's allocator, NULL while it does not exist (release_device_cache); set once, before any pool.
  std::function<gm_allocator *(c10::DeviceIndex)> device_allocator_of;

  // The pools' statistics on `device` added to the device allocator's `stats`, with those of the pools
  // gone (their counts and peaks stay the device's, as in native's one set of statistics per device).
  void add_statistics(c10::DeviceIndex device, gm_stats &stats) {
    for_each_pool(device, [&stats](gm_allocator *allocator, c10::cuda::MempoolId_t) {
      gm_stats more;
      if (gm_get_stats(allocator, &more) == GM_OK)
        add(stats, more);
    });
    std::lock_guard<std::mutex> guard(mutex_);
    auto gone = retired_.find(device);
    if (gone != retired_.end())
      add(stats, gone->second);
  }

  // torch.cuda.reset_accumulated_memory_stats / reset_peak_memory_stats of `device`: the pools gone too.
  void reset_retired(c10::DeviceIndex device, bool accumulated) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto gone = retired_.find(device);
    if (gone == retired_.end())
      return;
    gm_stats &kept = gone->second;
#define GPUMEM_RESET_STATISTIC(field, label, unit, origin)                                                            \
  for (int kind = 0; kind < GM_POOL_COUNT; kind++) {                                                                  \
    if (accumulated)                                                                                                  \
      kept.field[kind].allocated = kept.field[kind].freed = 0;                                                        \
    else                                                                                                              \
      kept.field[kind].peak = 0;                                                                                      \
  }
    GM_POOL_STATISTICS(GPUMEM_RESET_STATISTIC)
#undef GPUMEM_RESET_STATISTIC
#define GPUMEM_RESET_COUNTER(field, label, origin)                                                                    \
  if (accumulated)                                                                                                    \
    kept.field = 0;
    GM_COUNTERS(GPUMEM_RESET_COUNTER)
#undef GPUMEM_RESET_COUNTER
  }

 private:
  struct Route {
    SourcedPool *pool;
    Filter filter;
    uint64_t begun;
  };

  // The pool's gm_allocator: on its own allocator's memory or the device's, its blocks split or not
  // (mutex_ held). Configured as the device's allocators are (GPUMEM_CONF, then the backend and device,
  // then install()'s string), but for what is the device allocator's alone: publishing (a
  // monitor lists the device's allocator, whose statistics the pools' join only in PyTorch's) and the
  // memory limit (a fraction of the device, which the device's allocator keeps). On failure `undo` runs
  // and the error is raised.
  template <typename Undo> void make_allocator(SourcedPool &pool, Undo undo) {
    std::string config;
    if (const char *environment = std::getenv("GPUMEM_CONF"); environment && *environment)
      config = std::string(environment) + ",";
    config += "backend:cuda,device:" + std::to_string(pool.device);
    if (!user_config_.empty())
      config += "," + user_config_;
    config += ",publish:false,memory_limit:0";
    if (pool.unsplit)
      config += ",engine:segments,split_blocks:false";
    gm_segment_source from = {allocate_from, give_back_to, &pool};
    gm_status status = pool.source ? gm_create_with_source(config.c_str(), &from, &pool.allocator)
                                   : gm_create(config.c_str(), &pool.allocator);
    if (status != GM_OK) {
      std::string reason = gm_last_error();
      undo();
      TORCH_CHECK(false, "gpumem: cannot make the allocator of the memory pool: ", reason);
    }
    pool.owner = this;
    if (gm_on_pressure(pool.allocator, release_device_cache, &pool) != GM_OK)
      TORCH_WARN("gpumem: ", gm_last_error());
    count_.fetch_add(1, std::memory_order_seq_cst);
    if (on_made)
      on_made(pool.allocator, pool.device, pool.id);
  }

  // Its cached segments are given back first, as native's emptyCache(id) does when a MemPool goes: their
  // segment_free events reach the trace trackers and the history before the allocator goes.
  void destroy_allocator(SourcedPool &pool) {
    gm_empty_cache(pool.allocator);
    if (on_destroying)
      on_destroying(pool.allocator, pool.device, pool.id);
    retire_statistics(pool);
    gm_destroy(pool.allocator, nullptr);
    if (on_destroyed)
      on_destroyed(pool.allocator);
    pool.allocator = nullptr;
    count_.fetch_sub(1, std::memory_order_release);
  }

  static void add(gm_stats &stats, const gm_stats &more) {
#define GPUMEM_ADD_STATISTIC(field, label, unit, origin)                                                              \
  for (int kind = 0; kind < GM_POOL_COUNT; kind++) {                                                                  \
    stats.field[kind].current += more.field[kind].current;                                                            \
    stats.field[kind].peak += more.field[kind].peak;                                                                  \
    stats.field[kind].allocated += more.field[kind].allocated;                                                        \
    stats.field[kind].freed += more.field[kind].freed;                                                                \
  }
    GM_POOL_STATISTICS(GPUMEM_ADD_STATISTIC)
#undef GPUMEM_ADD_STATISTIC
#define GPUMEM_ADD_COUNTER(field, label, origin) stats.field += more.field;
    GM_COUNTERS(GPUMEM_ADD_COUNTER)
#undef GPUMEM_ADD_COUNTER
  }

  static void lend_on_out_of_memory(gm_allocator *device_allocator, gm_pressure_level level,
                                    const gm_pressure_readings *, void *context) {
    if (level != GM_PRESSURE_CRITICAL)
      return;
    auto *pools = static_cast<SourcedPools *>(context);
    std::lock_guard<std::mutex> guard(pools->mutex_);
    auto lending = pools->lending_devices_.find(device_allocator); // no exception crosses gpumem's C frames
    if (lending == pools->lending_devices_.end())
      return;
    for (SourcedPool &pool : pools->pools_)
      if (pool.device == lending->second && pools->marked_.count({pool.device, pool.id}))
        gm_empty_cache(pool.allocator);
  }

  // A pool's allocation would fail after its allocator released its own cache: as native's one allocator
  // per device releases the device's cached blocks too before it gives up, the device's allocator empties
  // its cache, and the pool's allocator tries once more (a pressure callback, as lend_on_out_of_memory).
  static void release_device_cache(gm_allocator *, gm_pressure_level level, const gm_pressure_readings *,
                                   void *context) {
    auto *pool = static_cast<SourcedPool *>(context);
    try { // no exception crosses gpumem's C frames
      gm_allocator *device_allocator = pool->owner->device_allocator_of(pool->device);
      if (level == GM_PRESSURE_CRITICAL && device_allocator)
        gm_empty_cache(device_allocator);
    } catch (...) {
    }
  }

  // The device's allocator calls lend_on_out_of_memory from now on (mutex_ held).
  void lend_for(c10::DeviceIndex device, gm_allocator *device_allocator) {
    if (!device_allocator || lending_devices_.count(device_allocator))
      return;
    TORCH_CHECK(gm_on_pressure(device_allocator, lend_on_out_of_memory, this) == GM_OK, "gpumem: ", gm_last_error());
    lending_devices_[device_allocator] = device;
  }

  // A pool about to go (mutex_ held): its counts and peaks are kept for its device, what it holds now
  // counted as freed (its segments go back with it).
  void retire_statistics(const SourcedPool &pool) {
    gm_stats stats;
    if (gm_get_stats(pool.allocator, &stats) != GM_OK)
      return;
#define GPUMEM_RELEASE_STATISTIC(field, label, unit, origin)                                                          \
  for (int kind = 0; kind < GM_POOL_COUNT; kind++) {                                                                  \
    stats.field[kind].freed += stats.field[kind].current;                                                             \
    stats.field[kind].current = 0;                                                                                    \
  }
    GM_POOL_STATISTICS(GPUMEM_RELEASE_STATISTIC)
#undef GPUMEM_RELEASE_STATISTIC
    add(retired_[pool.device], stats);
  }

  SourcedPool *find(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
    for (SourcedPool &pool : pools_)
      if (pool.device == device && pool.id == id)
        return &pool;
    return nullptr;
  }

  // Pools PyTorch released whose allocations are all freed: their memory goes back, they go.
  void sweep() {
    for (auto pool = pools_.begin(); pool != pools_.end();) {
      gm_stats stats;
      bool unused = pool->users <= 0 && gm_get_stats(pool->allocator, &stats) == GM_OK &&
                    stats.allocation[GM_POOL_ALL].current == 0;
      bool routed = false;
      for (const Route &route : routes_)
        routed = routed || route.pool == &*pool;
      if (!unused || routed) {
        ++pool;
        continue;
      }
      destroy_allocator(*pool);
      pool = pools_.erase(pool);
    }
  }

  const std::string user_config_;
  std::mutex mutex_;
  std::list<SourcedPool> pools_; // a list: the allocators' sources point at their element
  std::vector<Route> routes_;
  std::atomic<int> routing_{0};
  std::atomic<int> count_{0};
  std::map<c10::DeviceIndex, gm_stats> retired_; // the statistics of pools gone, by device (value-initialized)
  std::map<gm_allocator *, c10::DeviceIndex> lending_devices_; // device allocators with lend_on_out_of_memory
  std::set<std::pair<c10::DeviceIndex, c10::cuda::MempoolId_t>> marked_; // pools with use_on_oom, of any kind
};

} // namespace gpumem_pools
