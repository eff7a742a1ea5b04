// GPU memory of the devices a daemon's model instances use, read when /metrics or /active is
// asked (Triton reports nv_gpu_memory_total_bytes / nv_gpu_memory_used_bytes per GPU the same
// way). No torch in this header: the server's metrics include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace libreyolo::models {

/// One CUDA device's memory, bytes.
struct DeviceMemory {
  std::string device;                 ///< "cuda:N"
  std::uint64_t total_bytes = 0;      ///< the device's memory (cudaMemGetInfo)
  std::uint64_t used_bytes = 0;       ///< total - free: every process on the device
  std::uint64_t allocated_bytes = 0;  ///< tensors this process holds (caching allocator)
  std::uint64_t reserved_bytes = 0;   ///< what the caching allocator reserved (>= allocated)
};

/// The memory of every CUDA device named in `devices` ("cuda:N"; "cpu" and repeats are
/// skipped), in order of first mention. Never throws: a device that cannot be read (an index
/// that does not exist, a failed device, a LibTorch without CUDA) is left out, so a scrape
/// never fails. Only devices that are named are queried: asking a device creates a CUDA
/// context on it (~500 MiB), which a daemon must not do to GPUs it does not use.
std::vector<DeviceMemory> device_memory(const std::vector<std::string>& devices);

}  // namespace libreyolo::models
