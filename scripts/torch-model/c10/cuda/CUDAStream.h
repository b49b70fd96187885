#pragma once
#include <c10/core/DeviceType.h>
#include <cuda_runtime_api.h>
namespace c10::cuda {
struct CUDAStream { cudaStream_t stream() const; StreamId id() const; };
CUDAStream getCurrentCUDAStream(DeviceIndex device = -1);
}
