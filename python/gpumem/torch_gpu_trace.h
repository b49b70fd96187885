// torch_gpu_trace.h -- the GPU trace calls PyTorch's allocator makes, made by gpumem's adapter too.
//
// torch.cuda._gpu_trace lets Python code hear of every device allocation and free; the CUDA sanitizer
// (torch.cuda._sanitizer, TORCH_CUDA_SANITIZER=1) is its main listener: it forgets what a tensor's
// memory was used for when the memory is freed. Without these calls a block that gpumem hands out again
// still carries its last owner's accesses, and the sanitizer reports races that are none (a tensor freed
// after record_stream and its memory reused on another stream). The calls cost one load of a flag
// while no tracer is active, as native's do.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/macros/Macros.h>

#include <cstdint>

namespace gpumem_gpu_trace {

// Newer PyTorch versions name the device type in each call; older ones take the address alone. `call`
// forwards its arguments to one of the interpreter's trace functions.
template <typename Call>
auto with_device_type(const Call &call, uintptr_t address, int) -> decltype(call(c10::DeviceType::CUDA, address)) {
  call(c10::DeviceType::CUDA, address);
}
template <typename Call>
void with_device_type(const Call &call, uintptr_t address, long) {
  call(address);
}

// A device allocation made at `pointer` (none for nullptr: zero bytes).
inline void allocated(const void *pointer) {
  const c10::impl::PyInterpreter *interpreter = c10::impl::GPUTrace::get_trace();
  if (C10_LIKELY(interpreter == nullptr) || !pointer)
    return;
  const auto &table = *interpreter->operator->();
  with_device_type([&](auto... arguments) -> decltype(table.trace_gpu_memory_allocation(arguments...)) {
    table.trace_gpu_memory_allocation(arguments...);
  }, reinterpret_cast<uintptr_t>(pointer), 0);
}

// The allocation at `pointer` is about to be freed.
inline void freeing(const void *pointer) {
  const c10::impl::PyInterpreter *interpreter = c10::impl::GPUTrace::get_trace();
  if (C10_LIKELY(interpreter == nullptr) || !pointer)
    return;
  const auto &table = *interpreter->operator->();
  with_device_type([&](auto... arguments) -> decltype(table.trace_gpu_memory_deallocation(arguments...)) {
    table.trace_gpu_memory_deallocation(arguments...);
  }, reinterpret_cast<uintptr_t>(pointer), 0);
}

}  // namespace gpumem_gpu_trace
