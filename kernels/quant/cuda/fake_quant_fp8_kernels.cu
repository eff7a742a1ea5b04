// CUDA kernel of FP8 (E4M3FN) fake quantization (see fake_quant_fp8_cuda.h). Elementwise and
// memory-bound: 16-byte loads and stores, a grid-stride loop, the per-channel scale found by one
// 64-bit division per 4 elements.
#include "kernels/quant/cuda/fake_quant_fp8_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// max(scale, 1e-12) as at::clamp_min computes it: NaN stays NaN.
__device__ __forceinline__ float clamp_scale(float s) { return isnan(s) ? s : fmaxf(s, 1e-12f); }

__device__ __forceinline__ float fake_quant(float x, float s) {
  float y = __fdiv_rn(x, s);                          // true division, as the reference
  if (!isnan(y)) y = fminf(fmaxf(y, -448.f), 448.f);  // fminf/fmaxf would drop a NaN
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);  // RNE
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, __NV_E4M3);  // exact: e4m3 fits in half
  return __half2float(__half(h)) * s;
}

template <bool kPerChannel>
__global__ void __launch_bounds__(kThreads)
    fake_quant_fp8_kernel(const float* __restrict__ x, const float* __restrict__ scale,
                          float* __restrict__ y, int64_t n, int64_t inner, bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float s_tensor = kPerChannel ? 0.f : clamp_scale(scale[0]);
  const int64_t nvec = vec ? n / 4 : 0;
  for (int64_t v = tid; v < nvec; v += stride) {
    const float4 a = reinterpret_cast<const float4*>(x)[v];
    float s[4];
    if (kPerChannel) {
      int64_t ch = (v * 4) / inner, r = v * 4 - ch * inner;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s[k] = clamp_scale(scale[ch]);
        if (++r == inner) r = 0, ++ch;
      }
    } else {
      s[0] = s[1] = s[2] = s[3] = s_tensor;
    }
    reinterpret_cast<float4*>(y)[v] = make_float4(fake_quant(a.x, s[0]), fake_quant(a.y, s[1]),
                                                  fake_quant(a.z, s[2]), fake_quant(a.w, s[3]));
  }
  for (int64_t i = nvec * 4 + tid; i < n; i += stride) {
    const float s = kPerChannel ? clamp_scale(scale[i / inner]) : s_tensor;
    y[i] = fake_quant(x[i], s);
  }
}

}  // namespace

at::Tensor fake_quant_fp8_forward(const at::Tensor& x, const at::Tensor& scale) {
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(
      x.is_contiguous() && x.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat,
      "fake_quant_fp8 cuda: contiguous float32 x and float32 scale expected");
  auto y = at::empty(x.sizes(), x.options());
  const int64_t n = x.numel();
  if (n == 0) return y;
  const auto sc = scale.contiguous();
  const bool per_channel = sc.numel() != 1;
  TORCH_CHECK(!per_channel || (x.dim() >= 1 && sc.numel() == x.size(0)),
              "fake_quant_fp8 cuda: scale must have 1 or x.size(0) elements");
  const int64_t inner = per_channel ? n / x.size(0) : n;
  const bool vec = (reinterpret_cast<uintptr_t>(x.const_data_ptr()) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(y.const_data_ptr()) & 15u) == 0;
  const int64_t work = vec ? std::max<int64_t>(n / 4, 1) : n;
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, int64_t{1} << 20);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const float* xp = x.const_data_ptr<float>();
  const float* sp = sc.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  if (per_channel) {
    fake_quant_fp8_kernel<true><<<blocks, kThreads, 0, stream>>>(xp, sp, yp, n, inner, vec);
  } else {
    fake_quant_fp8_kernel<false><<<blocks, kThreads, 0, stream>>>(xp, sp, yp, n, inner, vec);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace libreyolo::kernels::cuda
