#pragma once
#include <c10/cuda/CUDACachingAllocator.h>
