// CUDA kernel of quantize_fp8_rows_bf16 (fp8_quant_rows_cuda.h): a warp per row, 16-byte loads,
// the row read twice (amax, then the quantisation from L1/L2), 8-byte stores.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/gemm/cuda/fp8_quant_rows_cuda.h"
#include "kernels/gemm/fp8_gemm.h"

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr float kE4m3Max = static_cast<float>(kFp8E4m3Max);  // 448, exact in float

// at::amax's maximum: a NaN wins over every number.
__device__ __forceinline__ float nan_max(float m, float a) { return (isnan(a) || a > m) ? a : m; }

__device__ __forceinline__ void unpack(const uint4& v, float (&f)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ __nv_fp8_storage_t quantise(float x, float scale) {
  float y = __fdiv_rn(x, scale);                               // IEEE division, as at::div
  if (!isnan(y)) y = fminf(fmaxf(y, -kE4m3Max), kE4m3Max);     // at::clamp keeps NaN
  return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);  // round to nearest even
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    quantize_rows_kernel(const uint4* __restrict__ x, uint2* __restrict__ data,
                         float* __restrict__ scale, int64_t rows, int64_t vecs_per_row) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint4* in = x + row * vecs_per_row;
  float amax = 0.f;
  for (int64_t v = lane; v < vecs_per_row; v += 32) {
    float f[8];
    unpack(in[v], f);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = nan_max(amax, fabsf(f[i]));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  // where(amax > 0, amax / 448, 1): a NaN row compares false and gets 1.
  const float s = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  if (lane == 0) scale[row] = s;
  uint2* out = data + row * vecs_per_row;
  for (int64_t v = lane; v < vecs_per_row; v += 32) {
    float f[8];
    unpack(in[v], f);
    uint32_t word[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      word[i / 4] |= static_cast<uint32_t>(quantise(f[i], s)) << (8 * (i % 4));
    out[v] = make_uint2(word[0], word[1]);
  }
}

}  // namespace

bool quantize_fp8_rows_bf16_accepts(const at::Tensor& x) {
  return x.defined() && x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 &&
         x.is_contiguous() && x.size(1) % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(x.const_data_ptr()) & 15u) == 0;
}

std::pair<at::Tensor, at::Tensor> quantize_fp8_rows_bf16(const at::Tensor& x) {
  TORCH_CHECK(quantize_fp8_rows_bf16_accepts(x),
              "fp8 quantize_rows cuda: a contiguous (M, K) bfloat16 CUDA tensor with K a "
              "multiple of 8 and a 16-byte aligned pointer expected");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), k = x.size(1);
  auto data = at::empty({rows, k}, x.options().dtype(at::kFloat8_e4m3fn));
  auto scale = at::empty({rows, 1}, x.options().dtype(at::kFloat));
  if (rows == 0 || k == 0) {
    scale.fill_(1.f);
    return {data, scale};
  }
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  TORCH_CHECK(blocks <= 0x7fffffff, "fp8 quantize_rows cuda: ", rows, " rows are too many");
  quantize_rows_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                         at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint4*>(x.const_data_ptr()),
      reinterpret_cast<uint2*>(data.mutable_data_ptr()), scale.mutable_data_ptr<float>(), rows,
      k / 8);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {data, scale};
}

}  // namespace libreyolo::kernels::cuda
