// The rotary_embedding kernel (rotary_embedding_cuda.h): one thread per V-element chunk of a row's
// first half and the matching chunk of its second half. Each product and the sum is one float32
// operation rounded to the storage dtype, as ATen's mul and add round them; the _rn intrinsics
// keep nvcc from contracting them into an FMA.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention/cuda/rotary_embedding_cuda.h"
#include "kernels/cuda/opmath_round.cuh"
#include "kernels/cuda/vector_pack.cuh"

namespace libreyolo::kernels::cuda {
namespace {

/// x's leading dimensions (all but the last), outermost first; the last of them is L.
struct Leading {
  int64_t sizes[kRotaryMaxLeadingDims];
  int64_t strides[kRotaryMaxLeadingDims];
  int dims;
};

template <typename T, int V>
__global__ void rotary_embedding_kernel(const T* __restrict__ x, const T* __restrict__ cos,
                                        const T* __restrict__ signed_sin, T* __restrict__ out,
                                        Leading lead, int64_t prefix, int half, int64_t items) {
  using R = Round<T>;
  using P = Pack<T, V>;
  const int chunks = half / V;
  const int64_t L = lead.sizes[lead.dims - 1];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks;
    const int c = static_cast<int>(i % chunks) * V;
    int64_t rest = row, offset = 0;
    for (int d = lead.dims - 1; d >= 0; --d) {
      offset += (rest % lead.sizes[d]) * lead.strides[d];
      rest /= lead.sizes[d];
    }
    const P a = *reinterpret_cast<const P*>(x + offset + c);
    const P b = *reinterpret_cast<const P*>(x + offset + half + c);
    P* first = reinterpret_cast<P*>(out + row * 2 * half + c);
    P* second = reinterpret_cast<P*>(out + row * 2 * half + half + c);
    const int64_t l = row % L;
    if (l < prefix) {  // CLS and register tokens: kept
      *first = a;
      *second = b;
      continue;
    }
    const int64_t t = (l - prefix) * 2 * half;
    const P c1 = *reinterpret_cast<const P*>(cos + t + c);
    const P c2 = *reinterpret_cast<const P*>(cos + t + half + c);
    const P s1 = *reinterpret_cast<const P*>(signed_sin + t + c);
    const P s2 = *reinterpret_cast<const P*>(signed_sin + t + half + c);
    P o1, o2;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p1 = R::load(a.v[k]), p2 = R::load(b.v[k]);
      // First half: p1 * cos1 + p2 * -sin1; second half: p2 * cos2 + p1 * sin2.
      o1.v[k] = R::store(__fadd_rn(R::to(__fmul_rn(p1, R::load(c1.v[k]))),
                                   R::to(__fmul_rn(p2, R::load(s1.v[k])))));
      o2.v[k] = R::store(__fadd_rn(R::to(__fmul_rn(p2, R::load(c2.v[k]))),
                                   R::to(__fmul_rn(p1, R::load(s2.v[k])))));
    }
    *first = o1;
    *second = o2;
  }
}

template <typename T>
void launch(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin,
            at::Tensor& out, int64_t prefix) {
  const int half = static_cast<int>(x.size(-1) / 2);
  Leading lead{};
  lead.dims = static_cast<int>(x.dim() - 1);
  bool wide = half % (16 / static_cast<int>(sizeof(T))) == 0 && aligned16(x.const_data_ptr()) &&
              aligned16(cos.const_data_ptr()) && aligned16(signed_sin.const_data_ptr());
  for (int d = 0; d < lead.dims; ++d) {
    lead.sizes[d] = x.size(d);
    lead.strides[d] = x.stride(d);
    wide = wide && (x.stride(d) * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  }
  const int64_t rows = x.numel() / x.size(-1);
  constexpr int kThreads = 256;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto* xp = reinterpret_cast<const T*>(x.const_data_ptr());
  const auto* cp = reinterpret_cast<const T*>(cos.const_data_ptr());
  const auto* sp = reinterpret_cast<const T*>(signed_sin.const_data_ptr());
  auto* op = reinterpret_cast<T*>(out.mutable_data_ptr());
  auto grid = [&](int64_t items) {
    return static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, 1 << 20));
  };
  if (wide) {
    constexpr int V = 16 / sizeof(T);
    const int64_t items = rows * (half / V);
    rotary_embedding_kernel<T, V>
        <<<grid(items), kThreads, 0, stream>>>(xp, cp, sp, op, lead, prefix, half, items);
  } else {
    const int64_t items = rows * half;
    rotary_embedding_kernel<T, 1>
        <<<grid(items), kThreads, 0, stream>>>(xp, cp, sp, op, lead, prefix, half, items);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& signed_sin, int64_t prefix) {
  TORCH_CHECK(x.is_cuda() && cos.device() == x.device() && signed_sin.device() == x.device(),
              "rotary_embedding (cuda): x, cos and signed_sin must be on one CUDA device");
  TORCH_CHECK(x.dim() >= 2 && x.dim() - 1 <= kRotaryMaxLeadingDims && x.size(-1) % 2 == 0 &&
                  x.stride(-1) == 1,
              "rotary_embedding (cuda): x ", x.sizes(),
              " must be (..., L, D) with D even, its "
              "last dimension contiguous, at most 6 leading dimensions");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == x.size(-1) && cos.size(0) + prefix == x.size(-2) &&
                  prefix >= 0 && signed_sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                  signed_sin.is_contiguous(),
              "rotary_embedding (cuda): cos ", cos.sizes(), " and signed_sin ", signed_sin.sizes(),
              " must be contiguous (L - prefix, D) for x ", x.sizes(), " and prefix ", prefix);
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && signed_sin.scalar_type() == x.scalar_type(),
              "rotary_embedding (cuda): x, cos and signed_sin must share one dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return out;
  switch (x.scalar_type()) {
    case at::kFloat:
      launch<float>(x, cos, signed_sin, out, prefix);
      break;
    case at::kHalf:
      launch<__half>(x, cos, signed_sin, out, prefix);
      break;
    case at::kBFloat16:
      launch<__nv_bfloat16>(x, cos, signed_sin, out, prefix);
      break;
    default:
      TORCH_CHECK(false, "rotary_embedding (cuda): dtype ", x.scalar_type());
  }
  return out;
}

}  // namespace libreyolo::kernels::cuda
