// torch_oom.h -- the text of torch.OutOfMemoryError while gpumem is PyTorch's allocator.
//
// People and tools read native's message: its first sentence ("CUDA out of memory. Tried to allocate
// 2.00 GiB.", which batch-size finders such as accelerate's look for) and its second ("GPU 0 has a
// total capacity of ... of which ... is free. ... Of the allocated memory ... is allocated by PyTorch,
// and ... is reserved by PyTorch but unallocated."), with sizes written as native writes them. gpumem's
// message keeps both, with the same meanings (the device's total and free memory from the driver; the
// allocated and reserved bytes of the device's allocator), then gives gpumem's own report: the cause
// and what to do. Native's last sentence advises PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; its
// allocator settings do not apply to gpumem, so the message says where gpumem's settings are instead.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpumem_oom {

// A size as native's format_size writes it: "512 bytes", "3.00 KiB", "1.50 MiB", "256.00 GiB".
inline std::string native_size(uint64_t size) {
  char text[64];
  if (size <= 1024)
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(size));
  else if (size <= 1048576)
    std::snprintf(text, sizeof text, "%.2f KiB", static_cast<double>(size) / 1024.0);
  else if (size <= 1073741824ULL)
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(size) / 1048576.0);
  else
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(size) / 1073741824.0);
  return text;
}

struct Reading {
  int device;
  uint64_t device_total, device_free; // the driver's
  uint64_t allowed;                   // the memory fraction's bytes, 0 without one
  uint64_t allocated, reserved;       // the device's gpumem allocator
};

// report: gpumem's out-of-memory report without its "gpumem: out of memory. " start, whose first line
// is "Tried to allocate SIZE (...) on stream S of cuda device D." and the rest the cause and remedies.
inline std::string message(const std::string &report, const Reading &reading) {
  size_t end_of_first = report.find('\n');
  std::string first = report.substr(0, end_of_first);
  std::string rest = end_of_first == std::string::npos ? "" : report.substr(end_of_first + 1);
  std::string text = "CUDA out of memory. " + first + " GPU " + std::to_string(reading.device) +
                     " has a total capacity of " + native_size(reading.device_total) + " of which " +
                     native_size(reading.device_free) + " is free. ";
  if (reading.allowed)
    text += native_size(reading.allowed) + " allowed; ";
  uint64_t unallocated = reading.reserved > reading.allocated ? reading.reserved - reading.allocated : 0;
  text += "Of the allocated memory " + native_size(reading.allocated) + " is allocated by PyTorch, and " +
          native_size(unallocated) + " is reserved by PyTorch but unallocated.\n" + rest;
  if (!text.empty() && text.back() != '\n')
    text += '\n';
  return text + "gpumem is PyTorch's allocator in this process: PYTORCH_CUDA_ALLOC_CONF's allocator settings "
                "(expandable_segments, ...) do not apply to it; its own are set in GPUMEM_CONF.";
}

} // namespace gpumem_oom
