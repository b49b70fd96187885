// A model of PyTorch's <c10/core/DeviceType.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <cstdint>
namespace c10 {
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
using DeviceIndex = int8_t;
using StreamId = int64_t;
struct Device { Device(DeviceType, DeviceIndex) {} };
}
