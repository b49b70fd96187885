#pragma once
#include <c10/core/DeviceType.h>
namespace c10::cuda { struct CUDAGuard { explicit CUDAGuard(DeviceIndex); ~CUDAGuard(); CUDAGuard(const CUDAGuard &) = delete; }; }
