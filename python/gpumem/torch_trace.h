// torch_trace.h -- gpumem's events and state as PyTorch's memory tools see them.
//
// History: torch.cuda.memory._record_memory_history / _snapshot (memory_viz). gpumem's history ring
// keeps the events; the Python stacks torch gathers are kept here, in a ring of their own, and found
// by the tag gpumem's tagger gives each event (the adapter call in progress on the thread). Snapshot
// segments are the runs of mapped blocks of gpumem's regions, named by their private pool, so that
// MemPool.snapshot() lists only its pool's.
//
// User metadata (torch.cuda.memory._set_memory_metadata) goes with each recorded event, as the stacks
// do; annotations (profiler ranges while history is recorded) are kept with the same capacity.
// An allocator may keep a ring of its own (GPUMEM_CONF history:N, which `gpumem run --report` sets and
// reads at exit): torch's recording makes that ring larger while it lasts, never smaller, and its end
// leaves the ring and its events; torch's snapshots show only the events since its recording began, at
// most max_entries of them, as native's.
//
// Observers: callbacks PyTorch lets others attach. Out-of-memory observers are called before the
// OutOfMemoryError is raised (torch._C._cuda_attach_out_of_memory_observer: dump a snapshot at the
// moment of failure). Trace trackers are called with each event as it happens, under gpumem's lock
// (gm_set_event_observer): ProcessGroupNCCL registers a segment with NCCL when it comes and deregisters
// it before it goes (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK, MemPools registered with NCCL).
// Memory of the pages engine comes and goes as chunks mapped into a reserved range, which PyTorch's
// expandable segments call segment_map / segment_unmap, as here; the segments engine and memory from a
// MemPool's own allocator are segments (segment_alloc / segment_free).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/ApproximateClock.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpumem.h"

namespace gpumem_trace {

using c10::GatheredContext;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using c10::cuda::MempoolId_t;
using c10::cuda::CUDACachingAllocator::AllocatorTraceTracker;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::OutOfMemoryObserver;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;

// The tag of the adapter call in progress on this thread: gpumem's tagger gives it to the call's events.
inline thread_local uint64_t current_tag = 0;
inline thread_local std::shared_ptr<GatheredContext> current_stack; // ...and its Python stack
inline uint64_t current_tag_of(void *) { return current_tag; }

inline MempoolId_t torch_pool(gm_pool_id pool) {
  return MempoolId_t{static_cast<c10::CaptureId_t>(pool.first), static_cast<c10::CaptureId_t>(pool.second)};
}

// The MemPool of an event or region: `own_pool` for an allocator that serves one MemPool, else the
// private pool gpumem names.
inline MempoolId_t pool_named(MempoolId_t own_pool, gm_pool_id pool) {
  return own_pool != MempoolId_t{0, 0} ? own_pool : torch_pool(pool);
}

inline bool is_pages_engine(gm_allocator *allocator) {
  gm_device_info info;
  return gm_get_device_info(allocator, &info) == GM_OK && std::string(info.engine) == "pages";
}

// PyTorch's action for a gpumem event; false for events PyTorch has no action for (pressure events).
inline bool action_of(gm_event_kind kind, bool pages, TraceEntry::Action *action) {
  switch (kind) {
    case GM_EVENT_ALLOC: *action = TraceEntry::ALLOC; return true;
    case GM_EVENT_FREE_REQUESTED: *action = TraceEntry::FREE_REQUESTED; return true;
    case GM_EVENT_FREE_COMPLETED: *action = TraceEntry::FREE_COMPLETED; return true;
    case GM_EVENT_SEGMENT_MAP: *action = pages ? TraceEntry::SEGMENT_MAP : TraceEntry::SEGMENT_ALLOC; return true;
    case GM_EVENT_SEGMENT_UNMAP: *action = pages ? TraceEntry::SEGMENT_UNMAP : TraceEntry::SEGMENT_FREE; return true;
    case GM_EVENT_OOM: *action = TraceEntry::OOM; return true;
    default: return false;
  }
}

// The name PyTorch's snapshots give an action (what _record_memory_history's skip_actions lists).
inline const char *action_name(TraceEntry::Action action) {
  switch (action) {
    case TraceEntry::ALLOC: return "alloc";
    case TraceEntry::FREE_REQUESTED: return "free_requested";
    case TraceEntry::FREE_COMPLETED: return "free_completed";
    case TraceEntry::SEGMENT_ALLOC: return "segment_alloc";
    case TraceEntry::SEGMENT_FREE: return "segment_free";
    case TraceEntry::SEGMENT_MAP: return "segment_map";
    case TraceEntry::SEGMENT_UNMAP: return "segment_unmap";
    case TraceEntry::OOM: return "oom";
    default: return "snapshot";
  }
}

class History {
 public:
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // _record_memory_history: the ring's size and what stacks to gather, applied to every allocator (each
  // one that for_each_allocator(visit) visits, under this object's lock: the devices' and the MemPools'
  // of their own). Called again while recording with clear_history false, the history recorded so far
  // stays (what fits).
  template <typename ForEach>
  void configure(bool enabled, CreateContextFn recorder, size_t max_entries, RecordContext when, bool clear,
                 const std::vector<std::string> &skip_actions, ForEach for_each_allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    size_t capacity = enabled ? std::min<size_t>(std::max<size_t>(max_entries, 1), 1u << 20) : 0;
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    skip_actions_ = skip_actions;
    if (enabled && !clear && enabled_.load(std::memory_order_relaxed))
      return resize(capacity, for_each_allocator);
    since_ns_ = monotonic_ns();
    contexts_.assign(capacity, nullptr);
    metadata_of_tag_.assign(capacity, std::string());
    annotations_.clear();
    {
      std::lock_guard<std::mutex> guard(retired_mutex_);
      retired_.clear();
    }
    if (!enabled) // cleared or begun again, blocks allocated before keep their stacks, as native's
      live_.clear();
    capacity_ = capacity;
    ring_of_new_pools_.store(capacity, std::memory_order_seq_cst);
    for_each_allocator([this](gm_allocator *allocator) { apply(allocator); });
    enabled_.store(enabled, std::memory_order_relaxed);
  }

  // A MemPool's allocator of its own, made under the pools' lock (which configure() takes inside this
  // object's, so not this object's lock here): the ring that the last configure() asked for. One made
  // before configure() visits the pools is visited; one made after reads what it stored. configure()
  // stores the ring, then reads the pools' count; a new pool adds itself to the count, then reads the
  // ring: all four sequentially consistent, so that at least one of the two sees the other.
  void adopt_pool(gm_allocator *allocator) {
    size_t ring = ring_of_new_pools_.load(std::memory_order_seq_cst);
    if (ring) {
      gm_set_history(allocator, ring);
      gm_set_history_tagger(allocator, current_tag_of, nullptr);
    }
  }

  // A new allocator gets the history settings; `publish` makes it visible inside the same lock, so that
  // a configure() running meanwhile cannot miss it.
  template <typename Publish> void adopt(gm_allocator *allocator, Publish publish) {
    std::lock_guard<std::mutex> guard(mutex_);
    size_t own = 0;
    if (gm_history_capacity(allocator, &own) == GM_OK && own)
      own_capacity_[allocator] = own;
    if (capacity_)
      apply(allocator);
    publish();
  }

  // Before a recorded allocation or free: a new tag, and the Python stack for it when torch asked for
  // stacks of such calls. The stack is gathered outside the lock, as PyTorch's allocator does:
  // gathering may need the GIL, which another thread may hold while it waits for this lock.
  // A free without a stack of its own (torch asked for stacks of allocations: context="alloc") is shown
  // with its allocation's, as native's.
  void begin_call(bool allocating, void *freeing = nullptr) {
    CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (allocating ? when_ != RecordContext::NEVER : when_ == RecordContext::ALL)
        recorder = recorder_;
    }
    std::shared_ptr<GatheredContext> stack = recorder ? recorder() : nullptr;
    std::lock_guard<std::mutex> guard(mutex_);
    if (!stack && !allocating && when_ == RecordContext::ALLOC) {
      auto live = live_.find(freeing);
      if (live != live_.end())
        stack = live->second;
    }
    current_tag = ++next_tag_;
    current_stack = stack;
    if (!contexts_.empty()) {
      contexts_[current_tag % contexts_.size()] = std::move(stack);
      metadata_of_tag_[current_tag % contexts_.size()] = metadata_;
    }
  }

  void set_metadata(const std::string &metadata) {
    std::lock_guard<std::mutex> guard(mutex_);
    metadata_ = metadata;
  }

  std::string metadata() {
    std::lock_guard<std::mutex> guard(mutex_);
    return metadata_;
  }

  // A profiler range begun or ended while history is recorded (recordAnnotation), at the time it happens.
  void annotate(c10::DeviceIndex device, const std::vector<std::pair<std::string, std::string>> &pairs) {
    if (!enabled())
      return;
    c10::CachingDeviceAllocator::AnnotationEntry entry(device, 0);
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    entry.time_.t_ = static_cast<time_t>(now.tv_sec * 1000000LL + now.tv_nsec / 1000);
    for (const auto &pair : pairs)
      entry.recordUserMetadata(pair.first, pair.second);
    std::lock_guard<std::mutex> guard(mutex_);
    if (!capacity_)
      return;
    if (annotations_.size() == capacity_)
      annotations_.pop_front();
    annotations_.push_back(std::move(entry));
  }

  // The annotations kept (mutex() held).
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations() const {
    return {annotations_.begin(), annotations_.end()};
  }

  // A live allocation keeps its stack for as long as it lives, however few events the ring keeps
  // (enabled="state" keeps none), as native keeps it in the block.
  void end_call(void *pointer, bool allocated) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (allocated && pointer)
      live_[pointer] = std::move(current_stack);
    else
      live_.erase(pointer);
    current_stack = nullptr;
    current_tag = 0;
  }

  // Held while a snapshot is put together (the stacks must not change under it).
  std::mutex &mutex() { return mutex_; }
  bool keeps_events() const { return capacity_ != 0; }

  // Each run of mapped blocks of a gpumem region is one segment, as PyTorch's snapshot lists them (memory
  // the pages engine made ahead of need comes as free blocks: the trace's segment_map covers it); with
  // a pool named, only that pool's. `own_pool` names the pool of an allocator that serves one MemPool.
  void add_segments(gm_allocator *allocator, c10::DeviceIndex device, SnapshotInfo &result, MempoolId_t only,
                    MempoolId_t own_pool = {0, 0}) {
    gm_snapshot *snapshot = nullptr;
    if (gm_snapshot_take(allocator, &snapshot) != GM_OK)
      return;
    bool pages = std::string(snapshot->device.engine) == "pages";
    bool any = only == MempoolId_t{0, 0};
    for (size_t r = 0; r < snapshot->region_count; r++) {
      const gm_snapshot_region &region = snapshot->regions[r];
      MempoolId_t pool = pool_named(own_pool, region.private_pool);
      if (!any && pool != only)
        continue;
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
          segment->owner_private_pool_id = pool;
        }
        c10::CachingDeviceAllocator::BlockInfo info;
        info.size = block.size;
        info.requested_size = block.requested;
        info.allocated = block.kind == GM_BLOCK_KIND_ALLOCATED;
        info.active = block.kind != GM_BLOCK_KIND_FREE;
        auto live = live_.find(reinterpret_cast<void *>(block.address));
        if (info.allocated && live != live_.end())
          info.context_when_allocated = live->second;
        segment->total_size += block.size;
        segment->requested_size += block.requested;
        segment->allocated_size += info.allocated ? block.size : 0;
        segment->active_size += info.active ? block.size : 0;
        segment->blocks.push_back(std::move(info));
      }
    }
    gm_snapshot_free(snapshot);
  }

  // A device's trace merged from its allocators' (the device's and its MemPools' of their own): in the
  // order of time, and no longer than native's one ring per device, the newest kept.
  void order(std::vector<TraceEntry> &trace) const {
    std::stable_sort(trace.begin(), trace.end(),
                     [](const TraceEntry &a, const TraceEntry &b) { return a.time_.t_ < b.time_.t_; });
    if (trace.size() > capacity_)
      trace.erase(trace.begin(), trace.end() - static_cast<std::ptrdiff_t>(capacity_));
  }

  // The events since torch's recording began, as PyTorch's trace entries; `own_pool` names the pool of an
  // allocator that serves one MemPool.
  void add_trace(gm_allocator *allocator, c10::DeviceIndex device, std::vector<TraceEntry> &trace,
                 MempoolId_t own_pool = {0, 0}) {
    std::vector<gm_event> events = events_of(allocator);
    size_t first = 0; // the allocator's own ring may hold older events, and more
    while (first < events.size() && events[first].time_ns < since_ns_)
      first++;
    first = std::max(first, events.size() - std::min(events.size(), capacity_));
    bool pages = is_pages_engine(allocator);
    int64_t offset_ns = realtime_offset_ns();
    for (size_t i = first; i < events.size(); i++)
      append(events[i], pages, device, own_pool, offset_ns, trace);
  }

  // A MemPool's allocator about to be destroyed: its events stay in its device's trace, as in native's one
  // ring per device. Called under the pools' lock, which snapshot() takes inside this object's lock: so
  // only retired_mutex_ (taken inside neither) here.
  void retire_pool(gm_allocator *allocator, c10::DeviceIndex device, MempoolId_t own_pool) {
    size_t ring = ring_of_new_pools_.load(std::memory_order_seq_cst);
    if (!ring)
      return;
    std::vector<gm_event> events = events_of(allocator);
    bool pages = is_pages_engine(allocator);
    std::lock_guard<std::mutex> guard(retired_mutex_);
    std::deque<Retired> &kept = retired_[device];
    for (const gm_event &event : events)
      kept.push_back(Retired{event, own_pool, pages});
    while (kept.size() > ring)
      kept.pop_front();
  }

  // The events of `device`'s MemPools destroyed since torch's recording began (mutex_ held).
  void add_retired(c10::DeviceIndex device, std::vector<TraceEntry> &trace) {
    std::lock_guard<std::mutex> guard(retired_mutex_);
    auto kept = retired_.find(device);
    if (kept == retired_.end())
      return;
    int64_t offset_ns = realtime_offset_ns();
    for (const Retired &retired : kept->second)
      if (retired.event.time_ns >= since_ns_)
        append(retired.event, retired.pages, device, retired.own_pool, offset_ns, trace);
  }

 private:
  struct Retired {
    gm_event event;
    MempoolId_t own_pool;
    bool pages;
  };

  static std::vector<gm_event> events_of(gm_allocator *allocator) {
    size_t count = 0;
    if (gm_history_read(allocator, nullptr, 0, &count, nullptr) != GM_OK)
      return {};
    std::vector<gm_event> events(count);
    if (gm_history_read(allocator, events.data(), events.size(), &count, nullptr) != GM_OK)
      return {};
    events.resize(std::min(count, events.size()));
    return events;
  }

  // gpumem's times are CLOCK_MONOTONIC; snapshots carry microseconds since the epoch.
  static int64_t realtime_offset_ns() {
    timespec now_real, now_monotonic;
    clock_gettime(CLOCK_REALTIME, &now_real);
    clock_gettime(CLOCK_MONOTONIC, &now_monotonic);
    return (now_real.tv_sec - now_monotonic.tv_sec) * 1000000000LL + now_real.tv_nsec - now_monotonic.tv_nsec;
  }

  // One gpumem event as PyTorch's trace entry, unless PyTorch has no such action or torch skips it
  // (mutex_ held).
  void append(const gm_event &event, bool pages, c10::DeviceIndex device, MempoolId_t own_pool, int64_t offset_ns,
              std::vector<TraceEntry> &trace) {
    TraceEntry::Action action;
    if (!action_of(event.kind, pages, &action) ||
        std::find(skip_actions_.begin(), skip_actions_.end(), action_name(action)) != skip_actions_.end())
      return;
    TraceEntry entry(action, device, static_cast<size_t>(event.address), static_cast<size_t>(event.size),
                     reinterpret_cast<void *>(event.stream), pool_named(own_pool, event.pool), c10::approx_time_t{0},
                     stack_of_tag(event.tag), "", metadata_of_tag(event.tag));
    entry.time_.t_ = static_cast<time_t>((static_cast<int64_t>(event.time_ns) + offset_ns) / 1000);
    trace.push_back(std::move(entry));
  }

  // Rings of another size that keep the newest of what they held (mutex_ held).
  template <typename ForEach> void resize(size_t capacity, ForEach for_each_allocator) {
    if (capacity == capacity_)
      return;
    std::vector<std::shared_ptr<GatheredContext>> contexts(capacity);
    std::vector<std::string> metadata(capacity);
    for (uint64_t tag = next_tag_ - std::min<uint64_t>(next_tag_, std::min(capacity, capacity_)) + 1;
         tag && tag <= next_tag_; tag++) {
      contexts[tag % capacity] = std::move(contexts_[tag % capacity_]);
      metadata[tag % capacity] = std::move(metadata_of_tag_[tag % capacity_]);
    }
    contexts_ = std::move(contexts);
    metadata_of_tag_ = std::move(metadata);
    while (annotations_.size() > capacity)
      annotations_.pop_front();
    capacity_ = capacity;
    ring_of_new_pools_.store(capacity, std::memory_order_seq_cst);
    for_each_allocator([this](gm_allocator *allocator) {
      gm_resize_history(allocator, std::max(capacity_, own_capacity(allocator)));
    });
  }

  // The ring's size and the tagger, for a new or every allocator (mutex_ held).
  void apply(gm_allocator *allocator) {
    size_t own = own_capacity(allocator);
    if (own)
      gm_resize_history(allocator, std::max(capacity_, own));
    else
      gm_set_history(allocator, capacity_);
    if (capacity_)
      gm_set_history_tagger(allocator, current_tag_of, nullptr);
  }

  // The ring the allocator keeps of its own, from its configuration (mutex_ held).
  size_t own_capacity(gm_allocator *allocator) const {
    auto own = own_capacity_.find(allocator);
    return own == own_capacity_.end() ? 0 : own->second;
  }

  static uint64_t monotonic_ns() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
  }

  // Whether the rings still hold what was kept for `tag` (mutex_ held).
  bool holds(uint64_t tag) const { return tag && !contexts_.empty() && tag + contexts_.size() > next_tag_; }

  // The stack of `tag`, and the user metadata set at its time (mutex_ held).
  std::shared_ptr<GatheredContext> stack_of_tag(uint64_t tag) {
    return holds(tag) ? contexts_[tag % contexts_.size()] : nullptr;
  }

  std::string metadata_of_tag(uint64_t tag) const {
    return holds(tag) ? metadata_of_tag_[tag % contexts_.size()] : std::string();
  }

  std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  size_t capacity_ = 0;
  std::atomic<size_t> ring_of_new_pools_{0}; // capacity_, read without the lock (adopt_pool)
  uint64_t since_ns_ = 0; // when torch's recording began (CLOCK_MONOTONIC, as gpumem's event times)
  std::unordered_map<gm_allocator *, size_t> own_capacity_;
  uint64_t next_tag_ = 0;
  std::vector<std::shared_ptr<GatheredContext>> contexts_; // tag % size -> the stack of that call
  std::vector<std::string> metadata_of_tag_;                // tag % size -> the user metadata then
  std::string metadata_;                                    // _set_memory_metadata's, now
  std::deque<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
  std::unordered_map<void *, std::shared_ptr<GatheredContext>> live_; // live allocation -> its stack
  std::vector<std::string> skip_actions_;
  std::mutex retired_mutex_; // inside mutex_ or the pools' lock, never around either
  std::unordered_map<c10::DeviceIndex, std::deque<Retired>> retired_; // destroyed MemPools' events, by device
};

class Observers {
 public:
  void attach_out_of_memory(OutOfMemoryObserver observer) {
    std::lock_guard<std::mutex> guard(mutex_);
    out_of_memory_.push_back(std::move(observer));
  }

  // Before an OutOfMemoryError: each observer, with no lock held (a Python observer takes the GIL and
  // may take a snapshot), as PyTorch's allocator calls them.
  void out_of_memory(c10::DeviceIndex device, size_t size, size_t limit, size_t device_free) {
    std::vector<OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      observers = out_of_memory_;
    }
    for (const OutOfMemoryObserver &observer : observers)
      observer(device, size, limit, device_free);
  }

  // A trace tracker; the caller then watches every allocator (watch), existing and future.
  void attach_tracker(AllocatorTraceTracker tracker) {
    std::lock_guard<std::mutex> guard(mutex_);
    trackers_.push_back(std::move(tracker));
    tracking_.store(true, std::memory_order_seq_cst);
  }

  // Sequentially consistent, as the store that publishes a new allocator: a tracker attached while an
  // allocator is made is seen by watch() or the attacher sees the allocator.
  bool tracking() const { return tracking_.load(std::memory_order_seq_cst); }

  // The trackers see `allocator`'s events from now on (once per allocator). `own_pool` names the pool
  // of an allocator that serves one MemPool.
  void watch(gm_allocator *allocator, c10::DeviceIndex device, MempoolId_t own_pool = {0, 0}) {
    if (!tracking())
      return;
    bool pages = is_pages_engine(allocator); // gpumem's lock, never taken inside mutex_ (on_event nests them)
    Watched *watched = nullptr;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      for (Watched &entry : watched_)
        if (entry.allocator == allocator && !entry.retiring)
          return;
      watched_.push_back(Watched{this, allocator, device, own_pool, pages});
      watched = &watched_.back(); // a list: the element stays where it is while the allocator lives
    }
    gm_set_event_observer(allocator, on_event, watched);
  }

  // An allocator about to be destroyed: its entry stays until forget() (its events during the destroy
  // still arrive there), but a new allocator made at its address meanwhile is watched anew.
  void retire(gm_allocator *allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    for (Watched &entry : watched_)
      if (entry.allocator == allocator)
        entry.retiring = true;
  }

  // A destroyed allocator is no longer watched.
  void forget(gm_allocator *allocator) {
    std::lock_guard<std::mutex> guard(mutex_);
    watched_.remove_if([allocator](const Watched &entry) { return entry.allocator == allocator && entry.retiring; });
  }

 private:
  struct Watched {
    Observers *owner;
    gm_allocator *allocator;
    c10::DeviceIndex device;
    MempoolId_t own_pool;
    bool pages;
    bool retiring = false;
  };

  // Under gpumem's lock (and then this mutex). An exception must not cross gpumem's C frames, and a
  // warning could need the GIL, which the thread waiting for gpumem's lock may hold: a tracker that
  // throws is ignored, as the event it missed.
  static void on_event(const gm_event *event, void *context) {
    auto *watched = static_cast<Watched *>(context);
    TraceEntry::Action action;
    if (!action_of(event->kind, watched->pages, &action))
      return;
    MempoolId_t pool = pool_named(watched->own_pool, event->pool);
    TraceEntry entry(action, watched->device, static_cast<size_t>(event->address), static_cast<size_t>(event->size),
                     reinterpret_cast<void *>(event->stream), pool, c10::getApproximateTime());
    std::lock_guard<std::mutex> guard(watched->owner->mutex_);
    for (const AllocatorTraceTracker &tracker : watched->owner->trackers_) {
      try {
        tracker(entry);
      } catch (...) {
      }
    }
  }

  std::mutex mutex_;
  std::vector<OutOfMemoryObserver> out_of_memory_;
  std::vector<AllocatorTraceTracker> trackers_;
  std::atomic<bool> tracking_{false};
  std::list<Watched> watched_;
};

} // namespace gpumem_trace
