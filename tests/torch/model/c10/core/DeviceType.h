#pragma once
#include <cstdint>
namespace c10 {
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
using DeviceIndex = int8_t;
using StreamId = int64_t;
struct Device { Device(DeviceType, DeviceIndex) {} };
}
