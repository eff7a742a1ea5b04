// The `cpu` implementation of ms_deform_attn: multi-scale deformable attention (Zhu et al.,
// "Deformable DETR", ICLR 2021, eq. 3) as one pass over the samples, for CPU models.
//
// Why: the portable path (kernels/attention/ms_deform_attn.cpp) runs a grid_sample per level on
// value transposed to (B*H, C, H_l, W_l), stacks the samples, multiplies by the weights and sums:
// a copy of every level per call, a (B*H, C, Q, L*P) intermediate, and for 16-bit values a
// float32 copy of the levels (LibTorch 2.11's 16-bit CPU grid_sampler is wrong). Here each
// (batch, query, head) reads its L*P bilinear samples straight from value's (B, S, H, C) layout,
// where a pixel's C channels of one head are contiguous, and accumulates them in float32.
//
// The arithmetic is grid_sample's (aten/src/ATen/native/cpu/GridSamplerKernel.cpp, bilinear,
// zeros padding, align_corners=False) on grid = 2 * loc - 1, as the portable path calls it:
// ix = gx * W / 2 + (W - 1) / 2, the four corner weights from floor(ix), floor(iy), corners outside
// the map read as zero; each sample nw + ne + sw + se in that order, times its attention weight,
// summed over levels and points. Coordinates and sums are float32 for every value dtype (as the
// CUDA kernels, fundamentalvision/Deformable-DETR models/ops/src/cuda/ms_deform_im2col_cuda.cuh);
// the output is rounded once to value's dtype. float32 results are within float32 rounding of the
// portable path's (the sum order differs); no autograd (an implementation brings its own backward:
// this one declines when a gradient is needed, and the portable path answers).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

/// (H_l, W_l) and the first token of every level, read from the slot's metadata tensors; empty
/// when they are malformed (not CPU int64 (L, 2) / (L), a size not positive, a level not where
/// the prefix sum puts it, or the levels not adding up to S): never trusted for indexing.
struct Levels {
  std::vector<int64_t> height, width, start;
};
Levels read_levels(const at::Tensor& shapes, const at::Tensor& starts, int64_t S, int64_t L) {
  if (!shapes.is_cpu() || !starts.is_cpu() || shapes.scalar_type() != at::kLong ||
      starts.scalar_type() != at::kLong || shapes.dim() != 2 || shapes.size(0) != L ||
      shapes.size(1) != 2 || starts.dim() != 1 || starts.size(0) != L)
    return {};
  const auto s = shapes.contiguous();
  const auto t = starts.contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t* tp = t.data_ptr<int64_t>();
  Levels levels;
  int64_t next = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t h = sp[2 * l], w = sp[2 * l + 1];
    if (h <= 0 || w <= 0 || tp[l] != next || h > S || w > S / h) return {};
    levels.height.push_back(h);
    levels.width.push_back(w);
    levels.start.push_back(next);
    next += h * w;
  }
  if (next != S) return {};
  return levels;
}

/// What one call samples: value (B, S, H, C), locations (B, Q, H, L, P, 2), weights (B, Q, H,
/// L, P) float32, out (B, Q, H * C); raw pointers into contiguous tensors.
template <class T>
struct Sampling {
  const T* value;
  const float* loc;
  const float* weight;
  T* out;
  int64_t S, H, C, Q, L, P;
  const Levels* levels;
};

/// The queries x heads [begin, end) of `s`; acc and sample: C floats of scratch each. Inlined
/// into the per-dtype clones below.
template <class T>
__attribute__((always_inline)) inline void sample_range(const Sampling<T>& s, int64_t begin,
                                                        int64_t end, float* __restrict acc,
                                                        float* __restrict sample) {
  const int64_t S = s.S, H = s.H, C = s.C, Q = s.Q, L = s.L, P = s.P;
  const Levels& lv = *s.levels;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / (Q * H), h = i % H;
    const T* vb = s.value + b * S * H * C + h * C;  // token t, channel c: vb[t * H * C + c]
    for (int64_t c = 0; c < C; ++c) acc[c] = 0.f;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t height = lv.height[l], width = lv.width[l];
      const T* vl = vb + lv.start[l] * H * C;
      const float fw = static_cast<float>(width), fh = static_cast<float>(height);
      for (int64_t p = 0; p < P; ++p) {
        const int64_t k = (i * L + l) * P + p;  // (b, q, h, l, p) in (B, Q, H, L, P)
        const float a = s.weight[k];
        // grid_sample's unnormalisation of grid = 2 * loc - 1 (align_corners=False) as its
        // vectorized CPU kernel computes it: g * (size / 2) + (size - 1) / 2 in one FMA.
        const float ix = std::fma(2.f * s.loc[2 * k] - 1.f, fw / 2, (fw - 1) / 2);
        const float iy = std::fma(2.f * s.loc[2 * k + 1] - 1.f, fh / 2, (fh - 1) / 2);
        // Outside (-1, W) x (-1, H) every corner is zero padding; NaN fails the test too.
        if (!(ix > -1.f && ix < fw && iy > -1.f && iy < fh)) continue;
        const float x0f = std::floor(ix), y0f = std::floor(iy);
        const int64_t x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
        const float dx = ix - x0f, dy = iy - y0f;
        const float corner_w[4] = {(1.f - dx) * (1.f - dy), dx * (1.f - dy), (1.f - dx) * dy,
                                   dx * dy};
        const int64_t corner_x[4] = {x0, x0 + 1, x0, x0 + 1};
        const int64_t corner_y[4] = {y0, y0, y0 + 1, y0 + 1};
        for (int64_t c = 0; c < C; ++c) sample[c] = 0.f;
        for (int n = 0; n < 4; ++n) {
          const int64_t x = corner_x[n], y = corner_y[n];
          if (x < 0 || x >= width || y < 0 || y >= height) continue;
          const T* __restrict px = vl + (y * width + x) * H * C;
          const float cw = corner_w[n];
          for (int64_t c = 0; c < C; ++c) sample[c] += cw * static_cast<float>(px[c]);
        }
        for (int64_t c = 0; c < C; ++c) acc[c] += a * sample[c];
      }
    }
    T* __restrict oi = s.out + i * C;  // (b, q, h) -> channels h * C .. h * C + C - 1
    for (int64_t c = 0; c < C; ++c) oi[c] = static_cast<T>(acc[c]);
  }
}

LIBREYOLO_TARGET_CLONES void sample_range_float(const Sampling<float>& s, int64_t begin,
                                                int64_t end, float* acc, float* sample) {
  sample_range(s, begin, end, acc, sample);
}
LIBREYOLO_TARGET_CLONES void sample_range_bfloat16(const Sampling<at::BFloat16>& s, int64_t begin,
                                                   int64_t end, float* acc, float* sample) {
  sample_range(s, begin, end, acc, sample);
}
LIBREYOLO_TARGET_CLONES void sample_range_half(const Sampling<at::Half>& s, int64_t begin,
                                               int64_t end, float* acc, float* sample) {
  sample_range(s, begin, end, acc, sample);
}

template <class T>
void sample_all(const at::Tensor& value, const Levels& lv, const at::Tensor& locs,
                const at::Tensor& weights, at::Tensor& out) {
  const Sampling<T> s{value.data_ptr<T>(),
                      locs.data_ptr<float>(),
                      weights.data_ptr<float>(),
                      out.data_ptr<T>(),
                      value.size(1),
                      value.size(2),
                      value.size(3),
                      locs.size(1),
                      locs.size(3),
                      locs.size(4),
                      &lv};
  at::parallel_for(0, value.size(0) * s.Q * s.H, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(s.C)), sample(static_cast<size_t>(s.C));
    if constexpr (std::is_same_v<T, float>)
      sample_range_float(s, begin, end, acc.data(), sample.data());
    else if constexpr (std::is_same_v<T, at::BFloat16>)
      sample_range_bfloat16(s, begin, end, acc.data(), sample.data());
    else
      sample_range_half(s, begin, end, acc.data(), sample.data());
  });
}

Outcome<at::Tensor> ms_deform_attn_cpu(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                       const at::Tensor& level_start_index,
                                       const at::Tensor& sampling_locations,
                                       const at::Tensor& attention_weights) {
  if (!value.is_cpu() || !sampling_locations.is_cpu() || !attention_weights.is_cpu())
    return Decline{"cpu: not a CPU tensor"};
  const auto dtype = value.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    return Decline{"cpu: dtype (float32, bfloat16 or float16)"};
  if (at::GradMode::is_enabled() && (value.requires_grad() || sampling_locations.requires_grad() ||
                                     attention_weights.requires_grad()))
    return Decline{"cpu: autograd (no backward)"};
  // The slot entry checked these (check_classic); a direct call of the handle must not index
  // past what value and the locations hold either.
  if (value.dim() != 4 || sampling_locations.dim() != 6 || attention_weights.dim() != 5 ||
      sampling_locations.size(0) != value.size(0) || sampling_locations.size(2) != value.size(2) ||
      sampling_locations.size(5) != 2 ||
      attention_weights.sizes() != sampling_locations.sizes().slice(0, 5))
    return Decline{"cpu: shape mismatch"};
  const auto levels =
      read_levels(spatial_shapes, level_start_index, value.size(1), sampling_locations.size(3));
  if (levels.start.empty()) return Decline{"cpu: malformed spatial metadata"};
  const auto v = value.contiguous();
  const auto locs = sampling_locations.to(at::kFloat).contiguous();
  const auto weights = attention_weights.to(at::kFloat).contiguous();
  auto out = at::empty({value.size(0), locs.size(1), value.size(2) * value.size(3)},
                       value.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  if (dtype == at::kFloat)
    sample_all<float>(v, levels, locs, weights, out);
  else if (dtype == at::kBFloat16)
    sample_all<at::BFloat16>(v, levels, locs, weights, out);
  else
    sample_all<at::Half>(v, levels, locs, weights, out);
  return out;
}

}  // namespace

void register_ms_deform_attn_cpu(Registry& registry) {
  registry.register_impl(
      kMsDeformAttn, "cpu", MsDeformAttnImpl(&ms_deform_attn_cpu), [] { return true; },
      &cpu_models_only);
}

}  // namespace libreyolo::kernels
