// A model of PyTorch's <c10/util/ApproximateClock.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <cstdint>
namespace c10 { using approx_time_t = uint64_t; inline approx_time_t getApproximateTime() { return 0; } }
