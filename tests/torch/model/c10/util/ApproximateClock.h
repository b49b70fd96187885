#pragma once
#include <cstdint>
namespace c10 { using approx_time_t = uint64_t; inline approx_time_t getApproximateTime() { return 0; } }
