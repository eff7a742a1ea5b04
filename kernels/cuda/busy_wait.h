// A kernel that keeps a stream busy for a while, so that work enqueued behind it is timed by CUDA
// events on the GPU alone: while it runs, the host enqueues the timed launches, and the events
// then measure them back to back instead of the host's launch rate (small kernels at batch 1
// take less GPU time than their launch costs the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace libreyolo::kernels::cuda {

/// Enqueues one single-thread kernel on `stream` that spins for `nanoseconds` of the GPU's global
/// timer (%globaltimer, PTX ISA "Special Registers"). Returns the launch's status; no
/// synchronisation.
cudaError_t busy_wait(cudaStream_t stream, int64_t nanoseconds);

}  // namespace libreyolo::kernels::cuda
