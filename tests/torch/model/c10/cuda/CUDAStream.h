// A model of PyTorch's <c10/cuda/CUDAStream.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/DeviceType.h>
#include <cuda_runtime_api.h>
namespace c10::cuda {
class CUDAStream {
 public:
  CUDAStream(cudaStream_t stream, StreamId id) : stream_(stream), id_(id) {}
  cudaStream_t stream() const { return stream_; }
  StreamId id() const { return id_; }
 private:
  cudaStream_t stream_;
  StreamId id_;
};
CUDAStream getCurrentCUDAStream(DeviceIndex device = -1);
}
