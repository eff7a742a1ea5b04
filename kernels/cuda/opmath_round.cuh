// Storage-dtype rounding for kernels that reproduce ATen's CUDA elementwise ops bit for bit: ATen
// computes float16 / bfloat16 ops in float32 (its opmath type) and rounds each op's result to the
// storage dtype (aten/src/ATen/OpMathType.h). Device code; included by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace libreyolo::kernels::cuda {

/// load: storage -> float32; store: float32 -> storage (round to nearest even); to: float32 ->
/// float32 as rounded through the storage dtype (the value an ATen op leaves behind).
template <typename T>
struct Round;
template <>
struct Round<float> {
  __device__ static __forceinline__ float load(float v) { return v; }
  __device__ static __forceinline__ float store(float v) { return v; }
  __device__ static __forceinline__ float to(float v) { return v; }
};
template <>
struct Round<__half> {
  __device__ static __forceinline__ float load(__half v) { return __half2float(v); }
  __device__ static __forceinline__ __half store(float v) { return __float2half_rn(v); }
  __device__ static __forceinline__ float to(float v) { return __half2float(__float2half_rn(v)); }
};
template <>
struct Round<__nv_bfloat16> {
  __device__ static __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
  __device__ static __forceinline__ float to(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
  }
};

}  // namespace libreyolo::kernels::cuda
