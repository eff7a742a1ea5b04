#include "models/runtime/device_memory.h"

#include <algorithm>
#include <exception>

#if LIBREYOLO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace libreyolo::models {

std::vector<DeviceMemory> device_memory(const std::vector<std::string>& devices) {
  std::vector<DeviceMemory> out;
#if LIBREYOLO_TORCH_CUDA
  std::vector<std::string> seen;
  for (const auto& name : devices) {
    if (name.rfind("cuda:", 0) != 0) continue;
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    seen.push_back(name);
    try {
      const int index = std::stoi(name.substr(5));
      if (index < 0 || index >= c10::cuda::device_count()) continue;
      const auto dev = static_cast<c10::DeviceIndex>(index);
      auto* allocator = c10::cuda::CUDACachingAllocator::get();
      const auto [free_bytes, total_bytes] = allocator->getMemoryInfo(dev);
      const auto stats = allocator->getDeviceStats(dev);
      constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      DeviceMemory m;
      m.device = name;
      m.total_bytes = total_bytes;
      m.used_bytes = total_bytes - std::min(free_bytes, total_bytes);
      m.allocated_bytes =
          static_cast<std::uint64_t>(std::max<int64_t>(0, stats.allocated_bytes[all].current));
      m.reserved_bytes =
          static_cast<std::uint64_t>(std::max<int64_t>(0, stats.reserved_bytes[all].current));
      out.push_back(std::move(m));
    } catch (const std::exception&) {
      // A device that cannot be read is left out (see the header).
    }
  }
#else
  (void)devices;
#endif
  return out;
}

}  // namespace libreyolo::models
