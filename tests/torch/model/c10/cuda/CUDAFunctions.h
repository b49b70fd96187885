#pragma once
#include <c10/core/DeviceType.h>
namespace c10::cuda { DeviceIndex device_count() noexcept; DeviceIndex current_device(); }
