// A model of PyTorch's <c10/cuda/CUDAGuard.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/DeviceType.h>
namespace c10::cuda { struct CUDAGuard { explicit CUDAGuard(DeviceIndex); ~CUDAGuard(); CUDAGuard(const CUDAGuard &) = delete; }; }
