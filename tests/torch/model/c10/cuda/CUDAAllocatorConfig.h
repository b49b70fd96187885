// A model of PyTorch's <c10/cuda/CUDAAllocatorConfig.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/cuda/CUDACachingAllocator.h>
