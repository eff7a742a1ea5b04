// Two CUDA events for timing a stretch of one stream (the tuned choices: cuBLASLt's timed
// algorithms, cudnn_graph's plans). Host code.
#pragma once

#include <cuda_runtime_api.h>

namespace libreyolo::kernels::cuda {

/// Creates both events, destroys them with it. ok() is false when either could not be created
/// (the caller decides whether that throws or skips the timing).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    if (cudaEventCreate(&start) != cudaSuccess) start = nullptr;
    if (cudaEventCreate(&stop) != cudaSuccess) stop = nullptr;
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
  bool ok() const { return start && stop; }
};

}  // namespace libreyolo::kernels::cuda
