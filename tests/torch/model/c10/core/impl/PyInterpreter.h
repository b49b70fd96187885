// A model of PyTorch's <c10/core/impl/PyInterpreter.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/DeviceType.h>
#include <cstdint>
namespace c10::impl {
struct PyInterpreterVTable {
  virtual ~PyInterpreterVTable() = default;
  virtual void trace_gpu_memory_allocation(c10::DeviceType device_type, uintptr_t ptr) const = 0;
  virtual void trace_gpu_memory_deallocation(c10::DeviceType device_type, uintptr_t ptr) const = 0;
};
struct PyInterpreter {
  const PyInterpreterVTable *vtable_;
  const PyInterpreterVTable &operator*() const noexcept { return *vtable_; }
  const PyInterpreterVTable *operator->() const noexcept { return vtable_; }
};
}
