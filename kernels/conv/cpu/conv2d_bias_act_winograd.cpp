// The `winograd` implementation of conv2d_bias_act (CPU, float32): 3x3 convolutions of stride 1
// by Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional
// Neural Networks", CVPR 2016, section 4): every 4x4 input tile d and 3x3 filter g give the 2x2
// output tile A^T [(G g G^T) . (B^T d B)] A, so a convolution becomes 16 GEMMs of
// (tiles x C_in) by (C_in x C_out): 16 multiplies per 2x2 outputs and channel pair instead of 36.
//
// Why: on an AVX2 CPU without AMX, oneDNN's direct convolution (the `onednn` implementation)
// already runs at about 93% of the cores' FMA peak (RT-DETR-R18's 3x3 convolutions: 170-180
// GFLOP/s on two Zen 3 cores, docs/BENCHMARKS.md); only fewer multiplies make it faster. ONNX
// Runtime (MLAS) and OpenVINO run these convolutions directly. F(2x2, 3x3) rather than F(4x4,
// 3x3): its transform coefficients are 0, +-1 and 1/2 (exact in float32; only the transforms'
// additions and the weight transform's one rounding add error), so its error stays near a
// direct convolution's (0.3-0.8x at::conv2d's against float64 in tests/unit/
// conv2d_bias_act_winograd_test.cpp), where F(4x4, 3x3)'s grows several-fold (Barabasz et al.,
// "Error Analysis and Improving the Accuracy of Winograd Convolution for Deep Neural Networks", ACM
// TOMS 2020).
//
// Layout: activations channels_last (NHWC), as the `onednn` convolutions around it keep them, so
// every transform reads and writes channel vectors. Tiles are processed in blocks of about 113 per
// thread: input transform -> 16 GEMMs (at::bmm_out: MKL's sgemm) -> output transform with
// the bias, residual and ReLU fused; SiLU, GELU and tanh run after it in place (ATen's kernels).
// The transformed weights U (16, C_in, C_out) are made once per weight (kernels/cpu/
// packed_weights.h): 16/9 of the weight's memory.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

/// Eight floats, unaligned (GCC / Clang vector extension: one AVX2 register in the avx2 clone,
/// two SSE registers in the baseline one).
typedef float Vec8 __attribute__((vector_size(32)));

/// Below this many input or output channels MKL's sgemm on (tiles x C_in) by (C_in x C_out) runs
/// far below its peak and the transforms weigh more: ResNet-vd's 32-channel stem convolutions at
/// 320x320 took 13.0 / 24.1 ms against oneDNN's 11.9 / 20.7 (tools/bench_kernels/
/// bench_conv_cpu.cpp, two Zen 3 cores), 64 channels at 160x160 7.9 against 9.8.
constexpr int64_t kWinogradMinChannels = 64;

inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof v); }

/// U = G g G^T for every (c_in, c_out) pair, stored (16, C_in, C_out): element e = 4 i + j of the
/// 4x4 tile, then the GEMM's (C_in x C_out) matrix. G = [[1, 0, 0], [1/2, 1/2, 1/2],
/// [1/2, -1/2, 1/2], [0, 0, 1]] (Lavin & Gray 2016, F(2x2, 3x3)). Computed in double, rounded
/// once. `w`: (C_out, C_in, 3, 3) float32.
at::Tensor transform_weight(const at::Tensor& w) {
  const auto wc = w.contiguous();
  const int64_t k_out = wc.size(0), c_in = wc.size(1);
  auto u = at::empty({16, c_in, k_out}, wc.options());
  const float* src = wc.data_ptr<float>();
  float* dst = u.data_ptr<float>();
  at::parallel_for(0, k_out, 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t c = 0; c < c_in; ++c) {
        const float* g = src + (k * c_in + c) * 9;
        double t[4][3];  // G g
        for (int j = 0; j < 3; ++j) {
          const double g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
          t[0][j] = g0;
          t[1][j] = 0.5 * (g0 + g1 + g2);
          t[2][j] = 0.5 * (g0 - g1 + g2);
          t[3][j] = g2;
        }
        for (int i = 0; i < 4; ++i) {
          const double r[4] = {t[i][0], 0.5 * (t[i][0] + t[i][1] + t[i][2]),
                               0.5 * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
          for (int j = 0; j < 4; ++j)
            dst[((i * 4 + j) * c_in + c) * k_out + k] = static_cast<float>(r[j]);
        }
      }
    }
  });
  return u;
}

/// One convolution's operands, NHWC.
struct Problem {
  const float* x;         ///< (N, H, W, C) input
  const float* bias;      ///< (K) or null
  const float* residual;  ///< (N, Ho, Wo, K) or null
  float* y;               ///< (N, Ho, Wo, K) output
  const float* zeros;     ///< C zeros: the padding
  int64_t n, h, w, c, k, ho, wo, pad_h, pad_w;
  int64_t tiles_h, tiles_w;
  bool relu;

  /// Tile t's image and the top-left output position of its 2x2 outputs (tiles numbered
  /// row-major per image).
  struct Tile {
    int64_t n, oh0, ow0;
  };
  Tile tile(int64_t t) const {
    return {t / (tiles_w * tiles_h), (t / tiles_w) % tiles_h * 2, t % tiles_w * 2};
  }
};

/// The output side of a 3x3 stride-1 convolution of an `in`-wide map padded by `pad` each side.
constexpr int64_t output_side(int64_t in, int64_t pad) { return in + 2 * pad - 2; }

/// V[e][t][c] = (B^T d B)[e] for tiles [t0, t0 + count): B^T = [[1, 0, -1, 0], [0, 1, 1, 0],
/// [0, -1, 1, 0], [0, 1, 0, -1]]. `v`: (16, count, C) with element stride `e_stride`.
LIBREYOLO_TARGET_CLONES void transform_input(const Problem& p, int64_t t0, int64_t count, float* v,
                                             int64_t e_stride) {
  const int64_t c_n = p.c, c8 = p.c / 8 * 8;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = t0 + i;
    const auto [n, oh0, ow0] = p.tile(t);
    const int64_t ih0 = oh0 - p.pad_h, iw0 = ow0 - p.pad_w;
    const float* d[16];
    for (int a = 0; a < 4; ++a) {
      for (int b = 0; b < 4; ++b) {
        const int64_t ih = ih0 + a, iw = iw0 + b;
        d[a * 4 + b] = (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w)
                           ? p.x + ((n * p.h + ih) * p.w + iw) * c_n
                           : p.zeros;
      }
    }
    float* out = v + i * c_n;
    const auto tile = [&](auto load, auto store, int64_t c) {
      decltype(load(d[0] + c)) r[4][4];
      for (int b = 0; b < 4; ++b) {  // B^T d: rows
        const auto d0 = load(d[b] + c), d1 = load(d[4 + b] + c), d2 = load(d[8 + b] + c),
                   d3 = load(d[12 + b] + c);
        r[0][b] = d0 - d2;
        r[1][b] = d1 + d2;
        r[2][b] = d2 - d1;
        r[3][b] = d1 - d3;
      }
      for (int a = 0; a < 4; ++a) {  // (B^T d) B: columns
        float* o = out + (a * 4) * e_stride + c;
        store(o, r[a][0] - r[a][2]);
        store(o + e_stride, r[a][1] + r[a][2]);
        store(o + 2 * e_stride, r[a][2] - r[a][1]);
        store(o + 3 * e_stride, r[a][1] - r[a][3]);
      }
    };
    for (int64_t c = 0; c < c8; c += 8) tile(load8, store8, c);
    for (int64_t c = c8; c < c_n; ++c)
      tile([](const float* q) { return *q; }, [](float* q, float s) { *q = s; }, c);
  }
}

/// y = relu?(A^T m A + bias + residual) for tiles [t0, t0 + count): A^T = [[1, 1, 1, 0],
/// [0, 1, -1, -1]]. `m`: (16, count, K) with element stride `e_stride`. The order of the adds
/// is the portable path's (convolution + bias, then + residual, then the activation).
LIBREYOLO_TARGET_CLONES void transform_output(const Problem& p, int64_t t0, int64_t count,
                                              const float* m, int64_t e_stride) {
  const int64_t k_n = p.k, k8 = p.k / 8 * 8;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = t0 + i;
    const Problem::Tile o = p.tile(t);
    const int64_t n = o.n, oh0 = o.oh0, ow0 = o.ow0;
    const int rows = std::min<int64_t>(2, p.ho - oh0), cols = std::min<int64_t>(2, p.wo - ow0);
    const float* in = m + i * k_n;
    const auto tile = [&](auto load, auto store, auto zero, int64_t k) {
      using V = decltype(load(in));
      V s[2][4];
      for (int b = 0; b < 4; ++b) {  // A^T m: rows
        const auto m0 = load(in + b * e_stride + k), m1 = load(in + (4 + b) * e_stride + k),
                   m2 = load(in + (8 + b) * e_stride + k), m3 = load(in + (12 + b) * e_stride + k);
        s[0][b] = m0 + m1 + m2;
        s[1][b] = m1 - m2 - m3;
      }
      const V bias = p.bias ? load(p.bias + k) : zero;
      for (int a = 0; a < rows; ++a) {
        const V y2[2] = {s[a][0] + s[a][1] + s[a][2], s[a][1] - s[a][2] - s[a][3]};
        for (int b = 0; b < cols; ++b) {
          const int64_t at = ((n * p.ho + oh0 + a) * p.wo + ow0 + b) * k_n + k;
          V y = y2[b];
          if (p.bias) y = y + bias;
          if (p.residual) y = y + load(p.residual + at);
          // NaN stays NaN, as at::relu keeps it.
          if (p.relu) y = y < zero ? zero : y;
          store(p.y + at, y);
        }
      }
    };
    for (int64_t k = 0; k < k8; k += 8) tile(load8, store8, Vec8{}, k);
    for (int64_t k = k8; k < k_n; ++k)
      tile([](const float* q) { return *q; }, [](float* q, float s) { *q = s; }, 0.0f, k);
  }
}

PackedWeights<int>& transformed_weights() {
  // Never destroyed: forwards may run at exit.
  static auto* table = new PackedWeights<int>();
  return *table;
}

/// Tiles per block: about 113 (GEMMs of 113 rows keep MKL's sgemm near its peak on two Zen 3
/// cores; docs/BENCHMARKS.md), fewer so that every thread gets as many blocks when there are only
/// a few, and odd: 16 matrices a multiple of 4 KiB apart would put every transform's 16 streams
/// into the same L1 sets (a 2x slower transform measured with 128 channels). One block runs on
/// the calling thread, where MKL's sgemm uses every thread itself.
int64_t tiles_per_block(int64_t tiles) {
  constexpr int64_t kTiles = 113;
  const int64_t threads = at::get_num_threads();
  int64_t blocks = (tiles + kTiles - 1) / kTiles;
  if (blocks > 1 && blocks < 4 * threads) blocks = (blocks + threads - 1) / threads * threads;
  return ((tiles + blocks - 1) / blocks) | 1;
}

at::Tensor run(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
               const at::Tensor& residual, const ConvGeometry& g, Activation act) {
  const auto x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const auto u = transformed_weights().get(weight, 0, transform_weight);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), k = weight.size(0);
  const int64_t ho = output_side(h, g.pad_h), wo = output_side(w, g.pad_w);
  auto y = at::empty({n, k, ho, wo}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const auto b = bias.defined() ? bias.contiguous() : at::Tensor();
  const auto r =
      residual.defined() ? residual.contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
  const auto zeros = at::zeros({c}, x.options());
  Problem p{x.data_ptr<float>(),
            b.defined() ? b.data_ptr<float>() : nullptr,
            r.defined() ? r.data_ptr<float>() : nullptr,
            y.data_ptr<float>(),
            zeros.data_ptr<float>(),
            n,
            h,
            w,
            c,
            k,
            ho,
            wo,
            g.pad_h,
            g.pad_w,
            (ho + 1) / 2,
            (wo + 1) / 2,
            act == Activation::relu};
  const int64_t tiles = n * p.tiles_h * p.tiles_w;
  const int64_t tb = tiles_per_block(tiles);
  const int64_t blocks = (tiles + tb - 1) / tb;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    // One block's buffers per thread; at::bmm_out runs MKL's sgemm on this thread (inside a
    // parallel region MKL does not start threads of its own). A shorter last block is packed as
    // densely, so that its 16 matrices stay one contiguous batch for at::bmm_out.
    auto v = at::empty({16 * tb * c}, x.options());
    auto mm = at::empty({16 * tb * k}, x.options());
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t t0 = blk * tb, count = std::min(tb, tiles - t0);
      transform_input(p, t0, count, v.data_ptr<float>(), count * c);
      auto mb = mm.narrow(0, 0, 16 * count * k).view({16, count, k});
      at::bmm_out(mb, v.narrow(0, 0, 16 * count * c).view({16, count, c}), u);
      transform_output(p, t0, count, mm.data_ptr<float>(), count * k);
    }
  });
  if (act != Activation::none && act != Activation::relu) apply_activation_(act, y);
  return y;
}

Outcome<at::Tensor> conv2d_bias_act_winograd(const at::Tensor& input, const at::Tensor& weight,
                                             const at::Tensor& bias, const at::Tensor& residual,
                                             const ConvGeometry& g, Activation act) {
  if (!input.device().is_cpu() || !weight.device().is_cpu())
    return Decline{"winograd: not a CPU tensor"};
  if (input.scalar_type() != at::kFloat) return Decline{"winograd: not float32"};
  if (input.layout() != at::kStrided || weight.layout() != at::kStrided)
    return Decline{"winograd: not a strided tensor"};
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return Decline{"winograd: autograd (the fused op has no backward)"};
  if (weight.size(2) != 3 || weight.size(3) != 3 || g.groups != 1 || g.stride_h != 1 ||
      g.stride_w != 1 || g.dilation_h != 1 || g.dilation_w != 1)
    return Decline{"winograd: not an ungrouped 3x3 convolution of stride 1"};
  if (g.pad_h < 0 || g.pad_h > 2 || g.pad_w < 0 || g.pad_w > 2)
    return Decline{"winograd: padding outside [0, 2]"};
  if (weight.size(0) < kWinogradMinChannels || weight.size(1) < kWinogradMinChannels)
    return Decline{"winograd: fewer than 64 input or output channels"};
  if (input.size(0) == 0) return Decline{"winograd: an empty batch"};
  if (output_side(input.size(2), g.pad_h) < 1 || output_side(input.size(3), g.pad_w) < 1)
    return Decline{"winograd: the map is smaller than the kernel"};
  // The operands are read through their host pointers: a bias or residual elsewhere declines
  // (the portable path then reports the mismatch as ATen's error).
  const auto host_float = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat;
  };
  if (bias.defined() && !host_float(bias))
    return Decline{"winograd: bias is not a strided float32 CPU tensor"};
  if (residual.defined()) {
    if (!host_float(residual))
      return Decline{"winograd: residual is not a strided float32 CPU tensor"};
    if (residual.sizes() != at::IntArrayRef{input.size(0), weight.size(0),
                                            output_side(input.size(2), g.pad_h),
                                            output_side(input.size(3), g.pad_w)})
      return Decline{"winograd: the residual's shape is not the output's"};
  }
  try {
    return run(input, weight, bias, residual, g, act);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the registry's out-of-memory handling (kernels/out_of_memory.h)
  } catch (const c10::Error&) {
    // One call failing (LibTorch's CPU allocator reports a failed allocation as a plain
    // c10::Error) must not disable the implementation for the process, as a throw would: the
    // next candidate runs this call, the next call tries again.
    return Decline{"winograd: this call failed"};
  }
}

}  // namespace

void register_conv2d_bias_act_winograd(Registry& registry) {
  registry.register_impl(kConv2dBiasAct, "winograd", &conv2d_bias_act_winograd, {},
                         &cpu_float32_models_only);
}

}  // namespace libreyolo::kernels
