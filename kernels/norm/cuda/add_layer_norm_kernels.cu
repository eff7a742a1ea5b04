// CUDA kernel of the `cuda` add_layer_norm (see add_layer_norm_cuda.h). Memory-bound: a warp
// owns a row, each lane up to V 16-byte vectors of it in registers, so x and delta are
// read from DRAM once and sum / norm written once. The arithmetic follows the unfused ATen ops:
// delta * scale and x + that are each rounded to the dtype (aten's mul and add compute in float
// and round); the LayerNorm works on the rounded sum in float32, out = w * (rstd * (y - mean)) + b
// (aten/src/ATen/native/cuda/layer_norm_kernel.cu vectorized_layer_norm_kernel_impl), with the
// mean and the (biased) variance from two passes over the registers instead of Welford's update:
// the same numbers to float32 rounding. Optional row gathers (add_layer_norm.h, "Row orders"):
// a warp's row may read x / delta and write sum / norm at other rows, so a window partition or
// reverse costs an int64 index load per row instead of a copy kernel over every element.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/vector_pack.cuh"
#include "kernels/norm/cuda/add_layer_norm_cuda.h"

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kWarps = 4;  // rows per block
constexpr int kLanes = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// T the dtype, N elements per 16-byte vector, V the most vectors a lane holds (the row has
// d / N vectors, lane l takes vectors l, l + 32, ...). `rows` counts norm rows. The rows are
// grouped per image (add_layer_norm.h "Row orders"): n_x rows of x, n_norm of norm, n_delta of
// delta per image. Norm row g * n_norm + j normalises sum row g * n_x + norm_rows[j] (the same
// row without norm_rows; norm_rows[j] == -1: a zero row), which is x's row plus delta's row
// g * n_delta + delta_rows[i] for x's row g * n_x + i (the same row without delta_rows).
template <typename T, int N, int V>
__global__ void __launch_bounds__(kWarps* kLanes)
    add_layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ delta,
                          const T* __restrict__ scale, const T* __restrict__ weight,
                          const T* __restrict__ bias, T* __restrict__ sum_out,
                          T* __restrict__ norm_out, const int64_t* __restrict__ norm_rows,
                          const int64_t* __restrict__ delta_rows, int64_t rows, int64_t n_x,
                          int64_t n_norm, int64_t n_delta, int d, float eps) {
  const int lane = threadIdx.x % kLanes;
  const int vectors = d / N;
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kLanes; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    int64_t src = row;
    if (norm_rows != nullptr) {
      // 32-bit division (the host checks the row counts fit): a 64-bit one is emulated in
      // about 70 instructions, as long as the row's memory time at Swin's 96 channels.
      const int64_t image = static_cast<uint32_t>(row) / static_cast<uint32_t>(n_norm);
      const int64_t local = norm_rows[row - image * n_norm];
      src = local < 0 ? -1 : image * n_x + local;
    }
    T* const norm_row = norm_out + row * d;
    if (src < 0) {  // a padding position (warp-uniform: the whole warp owns the row)
      Pack<T, N> zero;
#pragma unroll
      for (int k = 0; k < N; ++k) zero.v[k] = static_cast<T>(0.0f);
      for (int vec = lane; vec < vectors; vec += kLanes)
        *reinterpret_cast<Pack<T, N>*>(norm_row + static_cast<int64_t>(vec) * N) = zero;
      continue;
    }
    const int64_t base = src * d;
    const T* delta_row = nullptr;
    if (delta != nullptr) {
      int64_t at = src;
      if (delta_rows != nullptr) {
        const int64_t image = static_cast<uint32_t>(src) / static_cast<uint32_t>(n_x);
        at = image * n_delta + delta_rows[src - image * n_x];
      }
      delta_row = delta + at * d;
    }
    float y[V][N];
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = lane + i * kLanes;
      if (vec < vectors) {
        const int64_t at = base + static_cast<int64_t>(vec) * N;
        const auto xv = *reinterpret_cast<const Pack<T, N>*>(x + at);
        if (delta != nullptr) {
          const auto dv = *reinterpret_cast<const Pack<T, N>*>(delta_row + vec * N);
          Pack<T, N> sv;
          if (scale != nullptr) sv = *reinterpret_cast<const Pack<T, N>*>(scale + vec * N);
          Pack<T, N> out;
#pragma unroll
          for (int k = 0; k < N; ++k) {
            float t = static_cast<float>(dv.v[k]);
            // __fmul_rn / __fadd_rn: no FMA contraction (in float32 the rounding to T is a no-op,
            // and a fused multiply-add would round once where ATen's mul and add round twice).
            if (scale != nullptr)
              t = static_cast<float>(static_cast<T>(__fmul_rn(t, static_cast<float>(sv.v[k]))));
            out.v[k] = static_cast<T>(__fadd_rn(static_cast<float>(xv.v[k]), t));
            y[i][k] = static_cast<float>(out.v[k]);
            total += y[i][k];
          }
          *reinterpret_cast<Pack<T, N>*>(sum_out + at) = out;
        } else {
#pragma unroll
          for (int k = 0; k < N; ++k) {
            y[i][k] = static_cast<float>(xv.v[k]);
            total += y[i][k];
          }
        }
      }
    }
    const float mean = warp_sum(total) * inv_d;
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (lane + i * kLanes < vectors) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float c = y[i][k] - mean;
          squares += c * c;
        }
      }
    }
    const float rstd = rsqrtf(warp_sum(squares) * inv_d + eps);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int vec = lane + i * kLanes;
      if (vec < vectors) {
        const auto wv = *reinterpret_cast<const Pack<T, N>*>(weight + vec * N);
        const auto bv = *reinterpret_cast<const Pack<T, N>*>(bias + vec * N);
        Pack<T, N> out;
#pragma unroll
        for (int k = 0; k < N; ++k)
          out.v[k] = static_cast<T>(static_cast<float>(wv.v[k]) * (rstd * (y[i][k] - mean)) +
                                    static_cast<float>(bv.v[k]));
        *reinterpret_cast<Pack<T, N>*>(norm_row + static_cast<int64_t>(vec) * N) = out;
      }
    }
  }
}

/// The kernel's pointers (nullptr: absent).
template <typename T>
struct Args {
  const T *x, *delta, *scale, *weight, *bias;
  T *sum, *norm;
  const int64_t *norm_rows, *delta_rows;
};

/// Rows per image of x, norm and delta (the kernel's n_x, n_norm, n_delta).
struct Groups {
  int64_t x, norm, delta;
};

template <typename T, int N, int V>
void launch(const Args<T>& a, int64_t rows, const Groups& g, int d, float eps,
            cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>((rows + kWarps - 1) / kWarps, int64_t{1} << 20);
  add_layer_norm_kernel<T, N, V><<<static_cast<unsigned>(blocks), kWarps * kLanes, 0, stream>>>(
      a.x, a.delta, a.scale, a.weight, a.bias, a.sum, a.norm, a.norm_rows, a.delta_rows, rows, g.x,
      g.norm, g.delta, d, eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool add_layer_norm_supports(int64_t d, at::ScalarType dtype) {
  const int64_t n = dtype == at::kFloat ? 4 : 8;
  return d >= 1 && d <= kMaxLayerNormWidth && d % n == 0;
}

SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps,
                          const at::Tensor& norm_rows, const at::Tensor& delta_rows) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.is_cuda() && x.dim() >= 1 && x.is_contiguous(),
              "add_layer_norm (cuda): x must be a contiguous CUDA tensor (..., D)");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "add_layer_norm (cuda): x must be float32, float16 or bfloat16");
  const int64_t d = x.size(-1);
  TORCH_CHECK(add_layer_norm_supports(d, dtype), "add_layer_norm (cuda): width ", d,
              " is not a whole number of 16-byte vectors up to ", kMaxLayerNormWidth);
  auto same = [&](const at::Tensor& t) {
    return !t.defined() || (t.device() == x.device() && t.scalar_type() == dtype &&
                            t.is_contiguous() && aligned16(t.data_ptr()));
  };
  TORCH_CHECK(aligned16(x.data_ptr()) && same(delta) && same(scale) && weight.defined() &&
                  bias.defined() && same(weight) && same(bias),
              "add_layer_norm (cuda): every tensor must be contiguous, 16-byte aligned and of x's "
              "dtype and device");
  const bool ordered = norm_rows.defined() || delta_rows.defined();
  TORCH_CHECK(!ordered || x.dim() >= 2, "add_layer_norm (cuda): row orders need x (..., N, D)");
  const int64_t x_rows = x.numel() / d, n_x = x.dim() >= 2 ? x.size(-2) : x_rows;
  const int64_t images = n_x == 0 ? 0 : x_rows / n_x;
  auto index = [&](const at::Tensor& t, int64_t n) {
    return !t.defined() || (t.device() == x.device() && t.scalar_type() == at::kLong &&
                            t.dim() == 1 && t.is_contiguous() && (n < 0 || t.size(0) == n));
  };
  TORCH_CHECK(index(norm_rows, -1) && index(delta_rows, n_x) &&
                  (!delta_rows.defined() ||
                   (delta.defined() && delta.dim() == x.dim() && delta.size(-1) == d &&
                    delta.sizes().slice(0, x.dim() - 2) == x.sizes().slice(0, x.dim() - 2))),
              "add_layer_norm (cuda): norm_rows must be contiguous int64 (R), delta_rows int64 "
              "(N) with a delta (..., M, D) of x's leading dims, both on x's device");
  TORCH_CHECK(!delta.defined() || delta_rows.defined() || delta.sizes() == x.sizes(),
              "add_layer_norm (cuda): delta must have x's shape");
  const Groups groups{n_x, norm_rows.defined() ? norm_rows.size(0) : n_x,
                      delta_rows.defined() ? delta.size(-2) : n_x};
  at::Tensor norm;
  if (norm_rows.defined()) {
    auto sizes = x.sizes().vec();
    sizes[sizes.size() - 2] = groups.norm;
    norm = at::empty(sizes, x.options());
  } else {
    norm = at::empty_like(x, at::MemoryFormat::Contiguous);
  }
  auto sum = delta.defined() ? at::empty_like(x, at::MemoryFormat::Contiguous) : x;
  const int64_t rows = images * groups.norm;
  TORCH_CHECK(!ordered || (rows <= UINT32_MAX && x_rows <= UINT32_MAX),
              "add_layer_norm (cuda): row orders take at most 2^32 - 1 rows");
  if (rows == 0) return {sum, norm};
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "add_layer_norm", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    const Args<scalar_t> a{x.data_ptr<scalar_t>(),
                           delta.defined() ? delta.data_ptr<scalar_t>() : nullptr,
                           scale.defined() ? scale.data_ptr<scalar_t>() : nullptr,
                           weight.data_ptr<scalar_t>(),
                           bias.data_ptr<scalar_t>(),
                           delta.defined() ? sum.data_ptr<scalar_t>() : nullptr,
                           norm.data_ptr<scalar_t>(),
                           norm_rows.defined() ? norm_rows.data_ptr<int64_t>() : nullptr,
                           delta_rows.defined() ? delta_rows.data_ptr<int64_t>() : nullptr};
    const int vectors_per_lane = static_cast<int>((d / N + kLanes - 1) / kLanes);
    const auto e = static_cast<float>(eps);
    const int di = static_cast<int>(d);
    // kMaxLayerNormWidth / N / 32: 4 vectors of 8 (16-bit) or 8 of 4 (float32).
    if (vectors_per_lane <= 1) {
      launch<scalar_t, N, 1>(a, rows, groups, di, e, stream);
    } else if (vectors_per_lane <= 2) {
      launch<scalar_t, N, 2>(a, rows, groups, di, e, stream);
    } else if (vectors_per_lane <= 4) {
      launch<scalar_t, N, 4>(a, rows, groups, di, e, stream);
    } else {
      launch<scalar_t, N, 8>(a, rows, groups, di, e, stream);
    }
  });
  return {sum, norm};
}

}  // namespace libreyolo::kernels::cuda
