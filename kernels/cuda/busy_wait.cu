// busy_wait (kernels/cuda/busy_wait.h).
#include "kernels/cuda/busy_wait.h"

namespace libreyolo::kernels::cuda {
namespace {

__device__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void busy_wait_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

cudaError_t busy_wait(cudaStream_t stream, int64_t nanoseconds) {
  busy_wait_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(nanoseconds > 0 ? nanoseconds : 0));
  return cudaGetLastError();
}

}  // namespace libreyolo::kernels::cuda
