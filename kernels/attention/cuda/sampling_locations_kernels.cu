// The sampling_locations kernel (sampling_locations_cuda.h): one thread per (b, q, h, n) point,
// both coordinates. Each ATen op of upstream's expression is one float32 operation rounded to the
// storage dtype (ATen's opmath); __fmul_rn / __fadd_rn keep nvcc from contracting them into FMAs.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "kernels/attention/cuda/sampling_locations_cuda.h"
#include "kernels/cuda/opmath_round.cuh"

namespace libreyolo::kernels::cuda {
namespace {

// scale: the float32 reciprocal of the divisor (used when per_point is null).
template <typename T>
__global__ void sampling_locations_kernel(const T* __restrict__ offsets, const T* __restrict__ ref,
                                          const T* __restrict__ per_point, T* __restrict__ out,
                                          int total, int N, int HN, int Q, int64_t ref_b,
                                          int64_t ref_q, float scale, float factor) {
  using R = Round<T>;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int bq = t / HN, b = bq / Q, q = bq - b * Q;
  const T* box = ref + b * ref_b + q * ref_q;
  const float s = per_point ? R::load(per_point[t % N]) : scale;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float o = R::load(offsets[2 * static_cast<int64_t>(t) + c]);
    const float scaled = R::to(__fmul_rn(o, s));                        // offsets / P | * pp[n]
    const float sized = R::to(__fmul_rn(scaled, R::load(box[2 + c])));  // * wh
    const float shifted = R::to(__fmul_rn(sized, factor));              // * factor
    out[2 * static_cast<int64_t>(t) + c] = R::store(__fadd_rn(R::load(box[c]), shifted));  // xy +
  }
}

template <typename T>
void launch(const at::Tensor& offsets, const at::Tensor& ref, const at::Tensor& per_point,
            at::Tensor& out, float scale, float factor) {
  const int64_t B = offsets.size(0), Q = offsets.size(1), H = offsets.size(2), N = offsets.size(3);
  const int64_t total = B * Q * H * N;
  if (total == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  sampling_locations_kernel<T><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      static_cast<const T*>(offsets.const_data_ptr()), static_cast<const T*>(ref.const_data_ptr()),
      per_point.defined() ? static_cast<const T*>(per_point.const_data_ptr()) : nullptr,
      static_cast<T*>(out.mutable_data_ptr()), static_cast<int>(total), static_cast<int>(N),
      static_cast<int>(H * N), static_cast<int>(Q), ref.stride(0), ref.stride(1), scale, factor);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor sampling_locations(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const at::Tensor& per_point, double divisor, double factor) {
  TORCH_CHECK(
      offsets.is_cuda() && offsets.dim() == 5 && offsets.size(4) == 2 && offsets.is_contiguous(),
      "cuda::sampling_locations: offsets must be contiguous CUDA (B, Q, H, N, 2), got ",
      offsets.sizes());
  TORCH_CHECK(reference_boxes.device() == offsets.device() && reference_boxes.dim() == 3 &&
                  reference_boxes.size(0) == offsets.size(0) &&
                  reference_boxes.size(1) == offsets.size(1) && reference_boxes.size(2) == 4 &&
                  reference_boxes.stride(2) == 1 &&
                  reference_boxes.scalar_type() == offsets.scalar_type(),
              "cuda::sampling_locations: reference_boxes must be (B, Q, 4) with a contiguous last "
              "dimension, of the offsets' dtype and device");
  TORCH_CHECK(per_point.defined()
                  ? (per_point.device() == offsets.device() &&
                     per_point.scalar_type() == offsets.scalar_type() && per_point.dim() == 1 &&
                     per_point.size(0) == offsets.size(3) && per_point.is_contiguous())
                  : divisor > 0.0,
              "cuda::sampling_locations: per_point must be a contiguous (N) tensor of the offsets' "
              "dtype and device, or a divisor > 0 given");
  TORCH_CHECK(offsets.numel() / 2 < std::numeric_limits<int>::max(),
              "cuda::sampling_locations: 2^31 - 1 points or more");
  const c10::cuda::CUDAGuard guard(offsets.device());
  at::Tensor out = at::empty(offsets.sizes(), offsets.options());
  // ATen's `offsets / divisor`: opmath_t(1) / opmath_t(divisor), then a product; `* factor`
  // multiplies by the number cast to opmath_t (float32 for all three dtypes).
  const float scale = per_point.defined() ? 0.f : 1.0f / static_cast<float>(divisor);
  const auto f = static_cast<float>(factor);
  switch (offsets.scalar_type()) {
    case at::kFloat:
      launch<float>(offsets, reference_boxes, per_point, out, scale, f);
      break;
    case at::kHalf:
      launch<__half>(offsets, reference_boxes, per_point, out, scale, f);
      break;
    case at::kBFloat16:
      launch<__nv_bfloat16>(offsets, reference_boxes, per_point, out, scale, f);
      break;
    default:
      TORCH_CHECK(false, "cuda::sampling_locations: dtype ", offsets.scalar_type(),
                  " (float32, float16, bfloat16 only)");
  }
  return out;
}

}  // namespace libreyolo::kernels::cuda
