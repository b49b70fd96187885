// torch_settings.h -- what PyTorch's allocator settings say while gpumem is its allocator.
//
// PyTorch keeps its allocator settings (PYTORCH_CUDA_ALLOC_CONF, parsed into CUDAAllocatorConfig) apart
// from the allocator, and other parts of PyTorch read them. Two of those readers matter here:
//   - snapshots carry the settings (`allocator_settings`, shown by memory_viz): native fills them from
//     CUDAAllocatorConfig, and so does gpumem, so that they are the process's real settings;
//   - ProcessGroupNCCL, with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, registers every segment
//     of a snapshot with NCCL when it makes a communicator, then registers each segment_alloc and
//     deregisters each segment_free it is told of. Under expandable segments it turns that hook off:
//     their pages are mapped and unmapped (segment_map / segment_unmap), a registration of an unmapped
//     range goes stale, and NCCL would keep using memory that has gone. gpumem's pages engine maps and
//     unmaps pages the same way, so PyTorch is told that segments are expandable (the hook is then off,
//     as with native's expandable segments). The segments engine allocates and frees whole segments,
//     as native's default does, and leaves the settings as they are: the hook works there.
#pragma once

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <string>

#include "gpumem.h"

namespace gpumem_settings {

using c10::CachingAllocator::AcceleratorAllocatorConfig;
using c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;

// The settings, as native's snapshot gives them. The keys common to every device are read from c10's
// AcceleratorAllocatorConfig, whose one instance lives in c10: CUDAAllocatorConfig's instance is a
// static of an inline function, so this extension may hold a copy of its own, parsed from
// PYTORCH_CUDA_ALLOC_CONF once and blind to later changes (the CUDA-only keys come from it).
inline c10::cuda::CUDACachingAllocator::AllocatorConfigInfo config_metadata() {
  c10::cuda::CUDACachingAllocator::AllocatorConfigInfo info;
  info.garbage_collection_threshold = AcceleratorAllocatorConfig::garbage_collection_threshold();
  info.max_split_size = AcceleratorAllocatorConfig::max_split_size();
  info.expandable_segments = AcceleratorAllocatorConfig::use_expandable_segments();
  info.last_allocator_settings = AcceleratorAllocatorConfig::last_allocator_settings();
  info.roundup_power2_divisions = AcceleratorAllocatorConfig::roundup_power2_divisions();
  info.pinned_num_register_threads = CUDAAllocatorConfig::pinned_num_register_threads();
  info.release_lock_on_malloc = CUDAAllocatorConfig::release_lock_on_cudamalloc();
  info.pinned_use_host_register = CUDAAllocatorConfig::pinned_use_cuda_host_register();
  info.graph_capture_record_stream_reuse = CUDAAllocatorConfig::graph_capture_record_stream_reuse();
  return info;
}

// Whether allocators made with `config` (over GPUMEM_CONF) use the pages engine: asked of an allocator
// of the simulated device made with the same keys, so that the answer comes from gpumem's own parser.
// A configuration that does not parse there is taken to mean the default engine, pages.
inline bool uses_pages_engine(const std::string &config) {
  std::string probe = config.empty() ? "" : config + ",";
  probe += "backend:sim,publish:false";
  gm_allocator *allocator = nullptr;
  if (gm_create_from_environment(probe.c_str(), &allocator) != GM_OK)
    return true;
  gm_device_info info;
  bool pages = gm_get_device_info(allocator, &info) != GM_OK || std::string(info.engine) == "pages";
  gm_destroy(allocator, nullptr);
  return pages;
}

// At install: the settings say expandable segments when gpumem's engine behaves as they do. The
// settings string is parsed whole (keys it leaves out go back to their defaults), so the user's own
// settings are given again in front.
inline void declare_engine(const std::string &config) {
  if (!uses_pages_engine(config) || AcceleratorAllocatorConfig::use_expandable_segments())
    return;
  std::string settings = AcceleratorAllocatorConfig::last_allocator_settings();
  try {
    c10::CachingAllocator::setAllocatorSettings(settings.empty() ? "expandable_segments:True"
                                                                 : settings + ",expandable_segments:True");
  } catch (const c10::Error &error) {
    TORCH_WARN("gpumem: PyTorch's allocator settings (\"", settings, "\") do not take expandable_segments:True (",
               error.what_without_backtrace(), "); with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, NCCL "
               "registrations of memory that gpumem's pages engine unmaps would go stale: use engine:segments");
  }
}

}  // namespace gpumem_settings
