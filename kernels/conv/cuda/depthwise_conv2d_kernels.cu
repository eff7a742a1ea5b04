// CUDA kernels of the `cuda_depthwise` conv2d_bias_act (see depthwise_conv2d_cuda.h).
//
// Memory-bound: a depthwise tap is one multiply-add per element read, so the kernel's time is
// the map read once and the output written once. Each thread owns N consecutive channels (16
// bytes: 8 bf16 / fp16, 4 float32; N = 1 when C or the pointers do not allow it) of one output
// pixel (generic path) or of TW = 4 neighbouring output pixels of a row (tiled path: an input
// pixel of the row is loaded once for the up to kW outputs it feeds, instead of once per tap).
// Channel groups are the fastest index, so a warp reads consecutive 16-byte vectors of one
// pixel. The weight is (kH * kW, C), one 16-byte load per tap and channel group, served by L1 /
// L2 (it is small). Neighbouring rows' windows overlap in L1 / L2, so DRAM sees the map about
// once. Float32 sums, the bias, the residual and the activation, one rounding on the store.
#include "kernels/conv/cuda/depthwise_conv2d_cuda.h"
#include "kernels/cuda/activate.cuh"
#include "kernels/cuda/vector_pack.cuh"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 4;  // output pixels per thread on the tiled path

struct Shape {
  int64_t H, W, C, OH, OW;
  int kh, kw, sh, sw, ph, pw, dh, dw;
};

template <typename T, int N>
__device__ __forceinline__ void load_float(const T* p, float (&f)[N]) {
  const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) f[k] = static_cast<float>(v.v[k]);
}

// Splits a flat item index into (channel group, a, b, c) with a = q % A, b = (q / A) % Bd,
// c = q / (A * Bd), q = index / groups. In 32 bits when the launch allows (a 64-bit division is
// a long software routine on the GPU); three divisions per thread either way, against kh * kw *
// N multiply-adds per output pixel.
struct Split {
  int64_t group, a, b, c;
};
__device__ __forceinline__ Split split(int64_t i, int64_t groups, int64_t A, int64_t Bd,
                                       bool small) {
  Split s;
  if (small) {
    const uint32_t u = static_cast<uint32_t>(i), g = static_cast<uint32_t>(groups);
    const uint32_t q = u / g, a = static_cast<uint32_t>(A), bd = static_cast<uint32_t>(Bd);
    const uint32_t r = q / a;
    s.group = u - q * g, s.a = q - r * a, s.b = r % bd, s.c = r / bd;
  } else {
    const int64_t q = i / groups, r = q / A;
    s.group = i - q * groups, s.a = q - r * A, s.b = r % Bd, s.c = r / Bd;
  }
  return s;
}

// The epilogue of TW accumulated output pixels (consecutive in W, `valid` of them inside the
// map): + bias, + residual, act, one rounding, N channels per store. Sum order as the portable
// path's: ((conv + bias) + residual), then the activation.
template <Activation Act, typename T, int N, int TW>
__device__ __forceinline__ void finish(float (&acc)[TW][N], const T* __restrict__ bias,
                                       const T* __restrict__ residual, T* __restrict__ y, int64_t C,
                                       int valid) {
  constexpr bool kFast = sizeof(T) < 4;
  float b[N];
  if (bias) {
    load_float<T, N>(bias, b);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) b[k] = 0.f;
  }
#pragma unroll
  for (int o = 0; o < TW; ++o) {
    if (o >= valid) break;
    float r[N];
    if (residual) load_float<T, N>(residual + o * C, r);
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float v = acc[o][k];
      if (bias) v = v + b[k];
      if (residual) v = v + r[k];
      out.v[k] = static_cast<T>(activate<Act, kFast>(v));
    }
    *reinterpret_cast<Pack<T, N>*>(y + o * C) = out;
  }
}

// One switch per thread picks the activation (uniform across the launch): one kernel per
// geometry instead of five.
template <typename T, int N, int TW>
__device__ __forceinline__ void finish_any(Activation act, float (&acc)[TW][N],
                                           const T* __restrict__ bias,
                                           const T* __restrict__ residual, T* __restrict__ y,
                                           int64_t C, int valid) {
  switch (act) {
    case Activation::none:
      return finish<Activation::none, T, N, TW>(acc, bias, residual, y, C, valid);
    case Activation::relu:
      return finish<Activation::relu, T, N, TW>(acc, bias, residual, y, C, valid);
    case Activation::silu:
      return finish<Activation::silu, T, N, TW>(acc, bias, residual, y, C, valid);
    case Activation::gelu:
      return finish<Activation::gelu, T, N, TW>(acc, bias, residual, y, C, valid);
    case Activation::tanh:
      return finish<Activation::tanh, T, N, TW>(acc, bias, residual, y, C, valid);
  }
}

// Tiled path: item = (channel group, output row, tile of TW output pixels, batch), channel
// groups fastest, then rows: a block (256 threads) covers 256 / (C / N) rows of one tile, whose
// input windows overlap by kh - 1 rows in L1, on top of the kw - 1 columns a thread reuses in
// registers. Kernel width KW and stride S (both axes) are compile-time, so the loop over the
// row's (TW - 1) * S + KW input pixels and the taps each one feeds unroll to straight-line code;
// the kernel height is a runtime loop. Taps are summed in (r, s) row-major order, as the generic
// path does.
template <typename T, int N, int KW, int S>
__global__ void __launch_bounds__(kThreads)
    depthwise_tiled_kernel(const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, const T* __restrict__ residual,
                           T* __restrict__ y, Shape g, int64_t items, Activation act) {
  constexpr int TW = kTile;
  constexpr int kCols = (TW - 1) * S + KW;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= items) return;
  const int64_t groups = g.C / N, tiles = (g.OW + TW - 1) / TW;
  const Split p = split(i, groups, g.OH, tiles, items <= std::numeric_limits<int32_t>::max());
  const int64_t c0 = p.group * N, oh = p.a, ow0 = p.b * TW, b = p.c;
  const int64_t ih0 = oh * S - g.ph, iw0 = ow0 * S - g.pw;
  const T* xb = x + b * g.H * g.W * g.C + c0;
  float acc[TW][N];
#pragma unroll
  for (int o = 0; o < TW; ++o)
#pragma unroll
    for (int k = 0; k < N; ++k) acc[o][k] = 0.f;
  for (int r = 0; r < g.kh; ++r) {
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= g.H) continue;
    float wv[KW][N];
#pragma unroll
    for (int s = 0; s < KW; ++s) load_float<T, N>(w + (r * KW + s) * g.C + c0, wv[s]);
    const T* xr = xb + ih * g.W * g.C;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int64_t iw = iw0 + j;
      if (iw < 0 || iw >= g.W) continue;
      float f[N];
      load_float<T, N>(xr + iw * g.C, f);
#pragma unroll
      for (int s = 0; s < KW; ++s) {
        const int d = j - s;  // = o * S for the output o that tap s of this pixel feeds
        if (d >= 0 && d % S == 0 && d / S < TW) {
#pragma unroll
          for (int k = 0; k < N; ++k) acc[d / S][k] = fmaf(f[k], wv[s][k], acc[d / S][k]);
        }
      }
    }
  }
  const int64_t out = ((b * g.OH + oh) * g.OW + ow0) * g.C + c0;
  const int valid = static_cast<int>(g.OW - ow0 < TW ? g.OW - ow0 : TW);
  finish_any<T, N, TW>(act, acc, bias ? bias + c0 : nullptr, residual ? residual + out : nullptr,
                       y + out, g.C, valid);
}

// Generic path: item = (channel group, output pixel, output row, batch); any kernel size,
// stride and dilation; taps in (r, s) row-major order.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    depthwise_generic_kernel(const T* __restrict__ x, const T* __restrict__ w,
                             const T* __restrict__ bias, const T* __restrict__ residual,
                             T* __restrict__ y, Shape g, int64_t items, Activation act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= items) return;
  const int64_t groups = g.C / N;
  const Split p = split(i, groups, g.OW, g.OH, items <= std::numeric_limits<int32_t>::max());
  const int64_t c0 = p.group * N, ow = p.a, oh = p.b, b = p.c;
  const int64_t ih0 = oh * g.sh - g.ph, iw0 = ow * g.sw - g.pw;
  const T* xb = x + b * g.H * g.W * g.C + c0;
  float acc[1][N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[0][k] = 0.f;
  for (int r = 0; r < g.kh; ++r) {
    const int64_t ih = ih0 + static_cast<int64_t>(r) * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    for (int s = 0; s < g.kw; ++s) {
      const int64_t iw = iw0 + static_cast<int64_t>(s) * g.dw;
      if (iw < 0 || iw >= g.W) continue;
      float f[N], wv[N];
      load_float<T, N>(xb + (ih * g.W + iw) * g.C, f);
      load_float<T, N>(w + (r * g.kw + s) * g.C + c0, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[0][k] = fmaf(f[k], wv[k], acc[0][k]);
    }
  }
  const int64_t out = ((b * g.OH + oh) * g.OW + ow) * g.C + c0;
  finish_any<T, N, 1>(act, acc, bias ? bias + c0 : nullptr, residual ? residual + out : nullptr,
                      y + out, g.C, 1);
}

template <typename T, int N>
void launch(const Shape& g, int64_t batch, bool tiled, cudaStream_t stream, const T* x, const T* w,
            const T* bias, const T* residual, T* y, Activation act) {
  const int64_t groups = g.C / N;
  const int64_t per_row = tiled ? (g.OW + kTile - 1) / kTile : g.OW;
  const int64_t items = batch * g.OH * per_row * groups;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "depthwise_conv2d_nhwc: ", items,
              " items exceed one launch");
  const dim3 grid(static_cast<unsigned>(blocks));
  if (!tiled) {
    depthwise_generic_kernel<T, N>
        <<<grid, kThreads, 0, stream>>>(x, w, bias, residual, y, g, items, act);
    return;
  }
  auto run = [&](auto kw, auto s) {
    depthwise_tiled_kernel<T, N, decltype(kw)::value, decltype(s)::value>
        <<<grid, kThreads, 0, stream>>>(x, w, bias, residual, y, g, items, act);
  };
  using K3 = std::integral_constant<int, 3>;
  using K5 = std::integral_constant<int, 5>;
  using K7 = std::integral_constant<int, 7>;
  using S1 = std::integral_constant<int, 1>;
  using S2 = std::integral_constant<int, 2>;
  const bool s1 = g.sw == 1;
  switch (g.kw) {
    case 3:
      return s1 ? run(K3{}, S1{}) : run(K3{}, S2{});
    case 5:
      return s1 ? run(K5{}, S1{}) : run(K5{}, S2{});
    default:  // 7 (depthwise_conv2d_tiled)
      return s1 ? run(K7{}, S1{}) : run(K7{}, S2{});
  }
}

}  // namespace

at::Tensor depthwise_conv2d_nhwc(const at::Tensor& x, const at::Tensor& weight_khwc, int64_t kh,
                                 int64_t kw, const at::Tensor& bias, const at::Tensor& residual,
                                 const ConvGeometry& geometry, Activation act) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4,
              "depthwise_conv2d_nhwc: x must be a (B, C, H, W) CUDA tensor");
  const int64_t C = x.size(1);
  // The weight in its (C, 1, kh, kw) view for the shared rules.
  TORCH_CHECK(weight_khwc.dim() == 2 && weight_khwc.size(0) == kh * kw &&
                  weight_khwc.size(1) == C && weight_khwc.is_contiguous() &&
                  weight_khwc.scalar_type() == x.scalar_type() &&
                  weight_khwc.device() == x.device(),
              "depthwise_conv2d_nhwc: weight_khwc must be (kh * kw, C) = (", kh * kw, ", ", C,
              ") contiguous, x's dtype and device");
  const auto w4 = weight_khwc.t().view({C, 1, kh, kw});  // a view: the rules read its sizes
  if (const char* why = depthwise_conv2d_decline(x, w4, bias, residual, geometry))
    TORCH_CHECK(false, "depthwise_conv2d_nhwc: ", why);
  Shape g{};
  g.H = x.size(2), g.W = x.size(3), g.C = C;
  g.OH = conv_output_size(g.H, kh, geometry.pad_h, geometry.stride_h, geometry.dilation_h);
  g.OW = conv_output_size(g.W, kw, geometry.pad_w, geometry.stride_w, geometry.dilation_w);
  g.kh = static_cast<int>(kh), g.kw = static_cast<int>(kw);
  g.sh = static_cast<int>(geometry.stride_h), g.sw = static_cast<int>(geometry.stride_w);
  g.ph = static_cast<int>(geometry.pad_h), g.pw = static_cast<int>(geometry.pad_w);
  g.dh = static_cast<int>(geometry.dilation_h), g.dw = static_cast<int>(geometry.dilation_w);
  auto y = at::empty({x.size(0), C, g.OH, g.OW},
                     x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  at::Tensor r = residual;
  if (r.defined() && !r.is_contiguous(at::MemoryFormat::ChannelsLast))
    r = r.contiguous(at::MemoryFormat::ChannelsLast);
  const bool tiled = depthwise_conv2d_tiled(kw, geometry);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // float32 / float16 / bfloat16 only (the rules decline the rest): no float64 instantiations.
  auto run = [&](auto zero) {
    using scalar_t = decltype(zero);
    constexpr int N = 16 / sizeof(scalar_t);
    const auto* px = x.data_ptr<scalar_t>();
    const auto* pw = weight_khwc.data_ptr<scalar_t>();
    const auto* pb = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
    const auto* pr = r.defined() ? r.data_ptr<scalar_t>() : nullptr;
    auto* py = y.data_ptr<scalar_t>();
    const bool vec = C % N == 0 && aligned16(px) && aligned16(pw) && aligned16(py) &&
                     (!pb || aligned16(pb)) && (!pr || aligned16(pr));
    if (vec) {
      launch<scalar_t, N>(g, x.size(0), tiled, stream, px, pw, pb, pr, py, act);
    } else {
      launch<scalar_t, 1>(g, x.size(0), tiled, stream, px, pw, pb, pr, py, act);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  switch (x.scalar_type()) {
    case at::kFloat:
      run(0.f);
      break;
    case at::kHalf:
      run(c10::Half(0.f));
      break;
    default:  // bfloat16 (depthwise_conv2d_decline)
      run(c10::BFloat16(0.f));
      break;
  }
  return y;
}

}  // namespace libreyolo::kernels::cuda
