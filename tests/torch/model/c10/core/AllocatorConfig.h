// A model of PyTorch's <c10/core/AllocatorConfig.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <string>
#include <vector>
#include <cstddef>
namespace c10::CachingAllocator {
struct AcceleratorAllocatorConfig {
  static double garbage_collection_threshold(); static size_t max_split_size(); static bool use_expandable_segments();
  static std::string last_allocator_settings(); static std::vector<size_t> roundup_power2_divisions();
};
void setAllocatorSettings(const std::string &env);
enum struct StatType : uint64_t { AGGREGATE = 0, SMALL_POOL = 1, LARGE_POOL = 2, NUM_TYPES = 3 };
}
