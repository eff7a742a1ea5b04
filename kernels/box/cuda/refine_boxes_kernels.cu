// The refine_boxes kernel (refine_boxes_cuda.h): one thread per value. Each ATen op of upstream's
// expression is one float32 operation rounded to the storage dtype (ATen's opmath); the _rn
// intrinsics keep nvcc from contracting or reassociating them.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "kernels/box/cuda/refine_boxes_cuda.h"
#include "kernels/cuda/opmath_round.cuh"

namespace libreyolo::kernels::cuda {
namespace {

/// ATen's clamp_min with a scalar limit (TensorCompare.cu launch_clamp_scalar): NaN stays.
__device__ __forceinline__ float clamp_min(float v, float lo) {
  return isnan(v) ? v : fmaxf(v, lo);
}

template <typename T>
__global__ void refine_boxes_kernel(const T* __restrict__ delta, const T* __restrict__ reference,
                                    T* __restrict__ out, int n, float eps) {
  using R = Round<T>;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = R::load(reference[i]);
  const float c = isnan(x) ? x : fminf(fmaxf(x, 0.0f), 1.0f);       // clamp(0, 1): exact
  const float x1 = R::to(clamp_min(c, eps));                        // .clamp_min(eps)
  const float one_minus = R::to(__fadd_rn(1.0f, -c));               // 1 - c (fill, sub)
  const float x2 = R::to(clamp_min(one_minus, eps));                // .clamp_min(eps)
  const float inverse = R::to(logf(R::to(__fdiv_rn(x1, x2))));      // log(x1 / x2)
  const float sum = R::to(__fadd_rn(R::load(delta[i]), inverse));   // delta + inverse
  out[i] = R::store(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-sum))));  // sigmoid
}

template <typename T>
void launch(const at::Tensor& delta, const at::Tensor& reference, at::Tensor& out, float eps) {
  const int n = static_cast<int>(delta.numel());
  constexpr int kThreads = 256;
  const int blocks = (n + kThreads - 1) / kThreads;
  refine_boxes_kernel<T><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(delta.const_data_ptr()),
      reinterpret_cast<const T*>(reference.const_data_ptr()),
      reinterpret_cast<T*>(out.mutable_data_ptr()), n, eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor refine_boxes(const at::Tensor& delta, const at::Tensor& reference, double eps) {
  TORCH_CHECK(delta.is_cuda() && reference.device() == delta.device(),
              "refine_boxes (cuda): delta and reference must be on one CUDA device");
  TORCH_CHECK(
      delta.sizes() == reference.sizes() && delta.is_contiguous() && reference.is_contiguous(),
      "refine_boxes (cuda): delta and reference must be contiguous, of one shape");
  TORCH_CHECK(delta.scalar_type() == reference.scalar_type(),
              "refine_boxes (cuda): delta and reference must share one dtype");
  TORCH_CHECK(delta.numel() < std::numeric_limits<int>::max(),
              "refine_boxes (cuda): 2^31 - 1 values or more");
  const c10::cuda::CUDAGuard guard(delta.device());
  auto out = at::empty(delta.sizes(), delta.options());
  if (delta.numel() == 0) return out;
  // ATen turns a Python-number scalar into the op math type: float32 for every dtype here.
  const auto e = static_cast<float>(eps);
  switch (delta.scalar_type()) {
    case at::kFloat:
      launch<float>(delta, reference, out, e);
      break;
    case at::kHalf:
      launch<__half>(delta, reference, out, e);
      break;
    case at::kBFloat16:
      launch<__nv_bfloat16>(delta, reference, out, e);
      break;
    default:
      TORCH_CHECK(false, "refine_boxes (cuda): dtype ", delta.scalar_type());
  }
  return out;
}

}  // namespace libreyolo::kernels::cuda
