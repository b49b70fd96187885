// A model of PyTorch's <c10/cuda/CUDAFunctions.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/DeviceType.h>
namespace c10::cuda { DeviceIndex device_count() noexcept; DeviceIndex current_device(); }
