// The `winograd` implementation of conv2d_bias_act (CPU, float32): 3x3 convolutions of stride 1
// by Winograd's minimal filtering F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional
// Neural Networks", CVPR 2016, section 4.2): every 6x6 input tile d and 3x3 filter g give the 4x4
// output tile A^T [(G g G^T) . (B^T d B)] A, so a convolution becomes 36 GEMMs of (tiles x C_in)
// by (C_in x C_out): 36 multiplies per 4x4 outputs and channel pair instead of 144.
//
// Why: on an AVX2 CPU without AMX, oneDNN's direct convolution (the `onednn` implementation)
// already runs at about 93% of the cores' FMA peak (RT-DETR-R18's 3x3 convolutions: 170-180
// GFLOP/s on two Zen 3 cores, docs/BENCHMARKS.md); only fewer multiplies make it faster. ONNX
// Runtime (MLAS) and OpenVINO run these convolutions directly.
//
// Accuracy: F(4x4, 3x3)'s transforms multiply by up to 8 and 1/6, so its error is several times a
// direct convolution's (Barabasz et al., "Error Analysis and Improving the Accuracy of Winograd
// Convolution for Deep Neural Networks", ACM TOMS 2020): 2.5-19x at::conv2d's against float64 in
// tests/unit/conv2d_bias_act_winograd_test.cpp, a relative error near 1e-5; the CPU parity
// fixtures keep every bar with it (their 3x3 convolutions of 16 channels and more run it). F(2x2,
// 3x3), whose
// coefficients are exact in float32, ran from 64 channels until 2026-12-07 and was removed: F(4x4,
// 3x3) or oneDNN was faster at every channel count measured (enough_channels).
//
// Layout: activations channels_last (NHWC), as the `onednn` convolutions around it keep them, so
// every transform reads and writes channel vectors. Tiles are processed in blocks of 29-113 per
// thread: input transform -> 36 GEMMs -> output transform with the bias, residual and ReLU fused;
// SiLU, GELU and tanh run after it in place (ATen's kernels). The GEMMs run in
// kernels/cpu/panel_gemm.h's kernel on AVX2 CPUs without AVX-512 (1.1-1.2x MKL's sgemm there) and
// as at::bmm_out (MKL's sgemm) elsewhere. The transformed weights U (36, C_in, C_out), packed in
// that kernel's panels where it runs (C_out padded to a multiple of 16), are made once per weight
// (kernels/cpu/packed_weights.h): 4x the weight's memory, 4 ceil(C_out / 16) 16 / C_out x packed.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/panel_gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

/// Eight floats, unaligned (GCC / Clang vector extension: one AVX2 register in the avx2 clone,
/// two SSE registers in the baseline one).
typedef float Vec8 __attribute__((vector_size(32)));

/// Whether the multiplies saved pay for the transforms. F(4x4, 3x3) against oneDNN's direct
/// convolution on two Zen 1 cores, ReLU, 1 image (tools/bench_kernels/bench_conv_cpu.cpp,
/// docs/BENCHMARKS.md "Winograd on every thread"): 16 x 16 at 320x320 4.05 against 6.40 ms,
/// 12 x 12 5.29 against 6.34, 8 x 16 2.68 against 3.39, 8 x 8 3.28 against 2.16 (slower),
/// 32 x 32 12.5 against 25.6. From 16 channels each.
bool enough_channels(int64_t c_in, int64_t c_out) { return std::min(c_in, c_out) >= 16; }

inline Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof v); }

/// F(4x4, 3x3): 6x6 input tiles, 4x4 output tiles, interpolation points 0, +-1, +-2 and infinity
/// (Lavin & Gray 2016, section 4.2; the matrices of NNPACK's and wincnn's F(4, 3)).
struct F4x4 {
  static constexpr int kM = 4, kAlpha = 6;
  static constexpr double kG[kAlpha][3] = {{1.0 / 4, 0, 0},
                                           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                           {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                           {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                           {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                           {0, 0, 1}};
  /// w = B^T d, B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
  /// [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]].
  template <class V>
  static void input(const V (&d)[kAlpha], V (&w)[kAlpha]) {
    const V four = V{} + 4.0f, five = V{} + 5.0f, two = V{} + 2.0f;
    const V p = d[3] + d[4] - four * (d[1] + d[2]), q = d[4] - d[3] + four * (d[1] - d[2]);
    const V r = d[4] - d[2], t = two * (d[3] - d[1]);
    w[0] = four * d[0] - five * d[2] + d[4];
    w[1] = p;
    w[2] = q;
    w[3] = r + t;
    w[4] = r - t;
    w[5] = four * d[1] - five * d[3] + d[5];
  }
  /// y = A^T m, A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
  /// [0, 1, -1, 8, -8, 1]].
  template <class V>
  static void output(const V (&m)[kAlpha], V (&y)[kM]) {
    const V a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], e = m[3] - m[4];
    y[0] = m[0] + a + c;
    y[1] = b + (V{} + 2.0f) * e;
    y[2] = a + (V{} + 4.0f) * c;
    y[3] = b + (V{} + 8.0f) * e + m[5];
  }
};

/// U = G g G^T for every (c_in, c_out) pair, stored (alpha^2, C_in, C_out): element
/// e = alpha i + j of the tile, then the GEMM's (C_in x C_out) matrix; where
/// panel_gemm_available(), (alpha^2, panel_size(C_in, C_out)), each matrix packed by pack_panels.
/// Computed in double, rounded once. `w`: (C_out, C_in, 3, 3) float32.
template <class F>
at::Tensor transform_weight(const at::Tensor& w) {
  constexpr int a = F::kAlpha;
  const auto wc = w.contiguous();
  const int64_t k_out = wc.size(0), c_in = wc.size(1);
  auto u = at::empty({a * a, c_in, k_out}, wc.options());
  const float* src = wc.data_ptr<float>();
  float* dst = u.data_ptr<float>();
  at::parallel_for(0, k_out, 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t c = 0; c < c_in; ++c) {
        const float* g = src + (k * c_in + c) * 9;
        double t[a][3];  // G g
        for (int i = 0; i < a; ++i)
          for (int j = 0; j < 3; ++j)
            t[i][j] = F::kG[i][0] * g[j] + F::kG[i][1] * g[3 + j] + F::kG[i][2] * g[6 + j];
        for (int i = 0; i < a; ++i)
          for (int j = 0; j < a; ++j)
            dst[((i * a + j) * c_in + c) * k_out + k] = static_cast<float>(
                t[i][0] * F::kG[j][0] + t[i][1] * F::kG[j][1] + t[i][2] * F::kG[j][2]);
      }
    }
  });
  if (!panel_gemm_available()) return u;
  const int64_t size = panel_size(c_in, k_out);
  auto packed = at::empty({a * a, size}, wc.options());
  at::parallel_for(0, a * a, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      pack_panels(dst + e * c_in * k_out, k_out, c_in, k_out, packed.data_ptr<float>() + e * size);
  });
  return packed;
}

/// One convolution's operands, NHWC.
struct Problem {
  const float* x;         ///< (N, H, W, C) input
  const float* bias;      ///< (K) or null
  const float* residual;  ///< (N, Ho, Wo, K) or null
  float* y;               ///< (N, Ho, Wo, K) output
  const float* zeros;     ///< C zeros: the padding
  int64_t n, h, w, c, k, ho, wo, pad_h, pad_w;
  int64_t m;  ///< output tile side
  int64_t tiles_h, tiles_w;
  bool relu;

  /// Tile t's image and the top-left output position of its m x m outputs (tiles numbered
  /// row-major per image).
  struct Tile {
    int64_t n, oh0, ow0;
  };
  Tile tile(int64_t t) const {
    return {t / (tiles_w * tiles_h), (t / tiles_w) % tiles_h * m, t % tiles_w * m};
  }
};

/// The output side of a 3x3 stride-1 convolution of an `in`-wide map padded by `pad` each side.
constexpr int64_t output_side(int64_t in, int64_t pad) { return in + 2 * pad - 2; }

/// V[e][t][c] = (B^T d B)[e] for tiles [t0, t0 + count). `v`: (alpha^2, count, C) with element
/// stride `e_stride`.
template <class F>
LIBREYOLO_TARGET_CLONES void transform_input(const Problem& p, int64_t t0, int64_t count, float* v,
                                             int64_t e_stride) {
  constexpr int a = F::kAlpha;
  const int64_t c_n = p.c, c8 = p.c / 8 * 8;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = t0 + i;
    const auto [n, oh0, ow0] = p.tile(t);
    const int64_t ih0 = oh0 - p.pad_h, iw0 = ow0 - p.pad_w;
    const float* d[a * a];
    for (int r = 0; r < a; ++r) {
      for (int q = 0; q < a; ++q) {
        const int64_t ih = ih0 + r, iw = iw0 + q;
        d[r * a + q] = (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w)
                           ? p.x + ((n * p.h + ih) * p.w + iw) * c_n
                           : p.zeros;
      }
    }
    float* out = v + i * c_n;
    const auto tile = [&](auto load, auto store, int64_t c) {
      using V = decltype(load(d[0] + c));
      V r[a][a];
      for (int q = 0; q < a; ++q) {  // B^T d: columns
        V col[a], w[a];
        for (int row = 0; row < a; ++row) col[row] = load(d[row * a + q] + c);
        F::input(col, w);
        for (int row = 0; row < a; ++row) r[row][q] = w[row];
      }
      for (int row = 0; row < a; ++row) {  // (B^T d) B: rows
        V w[a];
        F::input(r[row], w);
        float* o = out + (row * a) * e_stride + c;
        for (int q = 0; q < a; ++q) store(o + q * e_stride, w[q]);
      }
    };
    for (int64_t c = 0; c < c8; c += 8) tile(load8, store8, c);
    for (int64_t c = c8; c < c_n; ++c)
      tile([](const float* q) { return *q; }, [](float* q, float s) { *q = s; }, c);
  }
}

/// y = relu?(A^T m A + bias + residual) for tiles [t0, t0 + count). `m`: (alpha^2, count, K)
/// with element stride `e_stride`. The order of the adds is the portable path's (convolution +
/// bias, then + residual, then the activation).
template <class F>
LIBREYOLO_TARGET_CLONES void transform_output(const Problem& p, int64_t t0, int64_t count,
                                              const float* m, int64_t e_stride) {
  constexpr int a = F::kAlpha, mt = F::kM;
  const int64_t k_n = p.k, k8 = p.k / 8 * 8;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = t0 + i;
    const Problem::Tile o = p.tile(t);
    const int64_t n = o.n, oh0 = o.oh0, ow0 = o.ow0;
    const int rows = std::min<int64_t>(mt, p.ho - oh0), cols = std::min<int64_t>(mt, p.wo - ow0);
    const float* in = m + i * k_n;
    const auto tile = [&](auto load, auto store, auto zero, int64_t k) {
      using V = decltype(load(in));
      V s[mt][a];
      for (int q = 0; q < a; ++q) {  // A^T m: columns
        V col[a], y[mt];
        for (int row = 0; row < a; ++row) col[row] = load(in + (row * a + q) * e_stride + k);
        F::output(col, y);
        for (int row = 0; row < mt; ++row) s[row][q] = y[row];
      }
      const V bias = p.bias ? load(p.bias + k) : zero;
      for (int row = 0; row < rows; ++row) {
        V y2[mt];
        F::output(s[row], y2);
        for (int q = 0; q < cols; ++q) {
          const int64_t at = ((n * p.ho + oh0 + row) * p.wo + ow0 + q) * k_n + k;
          V y = y2[q];
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

/// Tiles per block, odd: 36 matrices a multiple of 4 KiB apart would put every transform's 36
/// streams into the same L1 sets (a 2x slower transform measured with 128 channels and F(2x2,
/// 3x3)'s 16); fewer so that every thread gets as many blocks when there are only a few (a single
/// block is split by stage instead: run). The target size:
/// - gemm_panels: C_in C_out / (C_in + C_out) within [29, 113]. Each block streams all of U
///   (36 C_in C_out floats) past its tiles' 36 (C_in + C_out): more tiles amortise U at 256
///   channels, fewer keep a block's matrices nearer L1 / L2 at 32-128 (two Zen 1 cores,
///   bench_conv_cpu, 29 / 57 / 113 / 225 tiles: 64 x 64 at 160x160 9.19 / 9.61 / 9.92 / 10.29 ms,
///   256 x 256 at 40x40 8.53 / 7.73 / 7.47 / 7.44; docs/BENCHMARKS.md "Winograd on every thread").
/// - at::bmm_out: 113 (GEMMs of 113 rows kept MKL's sgemm near its peak on two Zen 3 cores; 33,
///   57 and 225 were slower, measured while the blocks ran on one thread and MKL's sgemm threaded
///   itself, before 2026-12-08).
int64_t tiles_per_block(int64_t tiles, int64_t c_in, int64_t c_out, bool panel) {
  const int64_t target = panel ? std::clamp<int64_t>(c_in * c_out / (c_in + c_out), 29, 113) : 113;
  const int64_t threads = at::get_num_threads();
  int64_t blocks = (tiles + target - 1) / target;
  if (blocks > 1 && blocks < 4 * threads) blocks = (blocks + threads - 1) / threads * threads;
  return ((tiles + blocks - 1) / blocks) | 1;
}

template <class F>
at::Tensor run(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
               const at::Tensor& residual, const ConvGeometry& g, Activation act) {
  constexpr int64_t e = F::kAlpha * F::kAlpha, mt = F::kM;
  const auto x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor u = transformed_weights().get(weight, F::kM, transform_weight<F>);
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
            mt,
            (ho + mt - 1) / mt,
            (wo + mt - 1) / mt,
            act == Activation::relu};
  const int64_t tiles = n * p.tiles_h * p.tiles_w;
  const bool panel = panel_gemm_available();
  const int64_t tb = tiles_per_block(tiles, c, k, panel);
  const int64_t blocks = (tiles + tb - 1) / tb;
  // The 36 GEMMs of `count` tiles, V (36, count, C) -> M (36, count, K). Outside a parallel
  // region they are split across the threads (by matrix; MKL's sgemm threads itself); inside one
  // (a block's loop) the nested at::parallel_for and MKL run on the calling thread.
  const auto multiply = [&](float* v, int64_t count, float* mm) {
    if (!panel) {
      auto mb = at::from_blob(mm, {e, count, k}, x.options());
      at::bmm_out(mb, at::from_blob(v, {e, count, c}, x.options()), u);
      return;
    }
    at::parallel_for(0, e, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        gemm_panels(v + i * count * c, c, count, c, u.data_ptr<float>() + i * u.size(1), k,
                    mm + i * count * k, k);
    });
  };
  if (blocks == 1 && at::get_num_threads() > 1) {
    // One block (few tiles) would leave the other threads idle: each stage is split across them
    // on its own.
    auto v = at::empty({e * tiles * c}, x.options());
    auto mm = at::empty({e * tiles * k}, x.options());
    float* vp = v.data_ptr<float>();
    float* mp = mm.data_ptr<float>();
    at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
      transform_input<F>(p, t0, t1 - t0, vp + t0 * c, tiles * c);
    });
    multiply(vp, tiles, mp);
    at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
      transform_output<F>(p, t0, t1 - t0, mp + t0 * k, tiles * k);
    });
  } else {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      // One block's buffers per thread. A shorter last block is packed as densely, so that its
      // alpha^2 matrices stay one contiguous batch.
      auto v = at::empty({e * tb * c}, x.options());
      auto mm = at::empty({e * tb * k}, x.options());
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t t0 = blk * tb, count = std::min(tb, tiles - t0);
        transform_input<F>(p, t0, count, v.data_ptr<float>(), count * c);
        multiply(v.data_ptr<float>(), count, mm.data_ptr<float>());
        transform_output<F>(p, t0, count, mm.data_ptr<float>(), count * k);
      }
    });
  }
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
  if (!enough_channels(weight.size(1), weight.size(0)))
    return Decline{"winograd: too few channels for the transforms to pay off"};
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
    return run<F4x4>(input, weight, bias, residual, g, act);
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
