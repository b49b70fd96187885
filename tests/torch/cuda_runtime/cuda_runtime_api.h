// A stand-in for CUDA's runtime header, for tests/torch/test_torch_adapter.cpp on machines without the
// CUDA toolkit: the few types and functions of CUDA's runtime API that the torch adapter and
// tests/torch/model use, declared as the CUDA runtime declares them. model_runtime.cpp defines them.
#pragma once
#include <stddef.h>

typedef struct CUstream_st *cudaStream_t;
enum cudaError { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorPeerAccessAlreadyEnabled = 704 };
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };

extern "C" {
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaGetLastError(void);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
}
