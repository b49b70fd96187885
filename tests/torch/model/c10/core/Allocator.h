// A model of PyTorch's <c10/core/Allocator.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>
#include <cstddef>
#include <memory>
namespace c10 {
using DeleterFnPtr = void (*)(void *);
struct DataPtr {
  DataPtr() = default;
  DataPtr(void *data, void *ctx, DeleterFnPtr deleter, Device) : data_(data), ctx_(ctx), deleter_(deleter) {}
  void *get() const { return data_; }
  DeleterFnPtr get_deleter() const { return deleter_; }
  void *data_ = nullptr, *ctx_ = nullptr; DeleterFnPtr deleter_ = nullptr;
};
struct Allocator { virtual ~Allocator() = default; virtual DataPtr allocate(size_t n) = 0; virtual DeleterFnPtr raw_deleter() const { return nullptr; } };
void SetAllocator(DeviceType, Allocator *, uint8_t priority = 0);
Allocator *GetAllocator(const DeviceType &);
bool memoryProfilingEnabled();
void reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved, Device device);
struct GatheredContext { virtual ~GatheredContext() = default; };
}
