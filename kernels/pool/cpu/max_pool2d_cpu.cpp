// The `cpu` implementation of max_pool2d: nn.MaxPool2d (eval mode) on channels_last CPU maps,
// without the argmax indices.
//
// Why: ATen's CPU max_pool2d on these maps runs aten::max_pool2d_with_indices (the profiler
// names it under the forward) and writes an int64 index map beside the output: for HGNetV2's stem
// pooling, (1, 32, 321, 321) bfloat16 -> (1, 32, 320, 320), 26 MB of fresh indices next to a 6.5 MB
// output. In D-FINE L's bfloat16 forward on a 2-core AMX Xeon (`perf`, 2026-12-05) ATen's pooling
// took 2.6% of the CPU samples, this one 1.1%: about 1.5 ms of 110, a small gain
// (docs/BENCHMARKS.md; OpenVINO's MaxPool on the same graph: 0.8 ms). The
// activations of CPU models are channels_last (the `onednn` conv2d_bias_act writes nhwc), where a
// pixel's C channels are contiguous: each output pixel is the element-wise maximum of its window's
// pixel vectors.
//
// Semantics are ATen's (aten/src/ATen/native/cpu/MaxPoolKernel.cpp cpu_max_pool_channels_last):
// padding is implicit -infinity (a tap outside the map is skipped), a NaN in the window wins
// (`val > max || isnan(val)`), 16-bit values are compared as float32. The maximum is one of the
// inputs, so the output equals ATen's bit for bit (NaN payloads included).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/target_clones.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/pool/max_pool2d_problem.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

/// One call: input (B, H, W, C) and output (B, OH, OW, C) in memory order (channels_last).
template <class T>
struct Pooling {
  const T* in;
  T* out;
  int64_t H, W, C, OH, OW;
  PoolGeometry g;
};

/// float -> T for a float that came from a T (or -inf): exact, so bfloat16 needs no rounding
/// (its bits are float32's upper half), which keeps the store loop vectorisable.
template <class T>
__attribute__((always_inline)) inline T exact_from_float(float v) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return at::BFloat16(static_cast<std::uint16_t>(bits >> 16), at::BFloat16::from_bits());
  } else {
    return static_cast<T>(v);
  }
}

/// Output rows [begin, end) of (B * OH); acc: C floats of scratch. Inlined into the per-dtype
/// clones below.
template <class T>
__attribute__((always_inline)) inline void pool_rows(const Pooling<T>& p, int64_t begin,
                                                     int64_t end, float* __restrict acc) {
  const PoolGeometry& g = p.g;
  const int64_t H = p.H, W = p.W, C = p.C;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / p.OH, oy = r % p.OH;
    const int64_t y0 = oy * g.stride_h - g.pad_h;
    for (int64_t ox = 0; ox < p.OW; ++ox) {
      const int64_t x0 = ox * g.stride_w - g.pad_w;
      for (int64_t c = 0; c < C; ++c) acc[c] = -std::numeric_limits<float>::infinity();
      for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
        const int64_t y = y0 + ky * g.dilation_h;
        if (y < 0 || y >= H) continue;
        for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
          const int64_t x = x0 + kx * g.dilation_w;
          if (x < 0 || x >= W) continue;
          const T* __restrict px = p.in + ((b * H + y) * W + x) * C;
          for (int64_t c = 0; c < C; ++c) {
            const float v = static_cast<float>(px[c]);
            acc[c] = (v > acc[c] || v != v) ? v : acc[c];
          }
        }
      }
      T* __restrict o = p.out + (r * p.OW + ox) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = exact_from_float<T>(acc[c]);
    }
  }
}

LIBREYOLO_TARGET_CLONES void pool_rows_float(const Pooling<float>& p, int64_t begin, int64_t end,
                                             float* acc) {
  pool_rows(p, begin, end, acc);
}
LIBREYOLO_TARGET_CLONES void pool_rows_bfloat16(const Pooling<at::BFloat16>& p, int64_t begin,
                                                int64_t end, float* acc) {
  pool_rows(p, begin, end, acc);
}
LIBREYOLO_TARGET_CLONES void pool_rows_half(const Pooling<at::Half>& p, int64_t begin, int64_t end,
                                            float* acc) {
  pool_rows(p, begin, end, acc);
}

template <class T>
void pool_all(const at::Tensor& x, const PoolGeometry& g, at::Tensor& out) {
  const Pooling<T> p{x.data_ptr<T>(), out.data_ptr<T>(), x.size(2),   x.size(3),
                     x.size(1),       out.size(2),       out.size(3), g};
  // About 64k window taps per task: HGNetV2's stem is one output row per task.
  const int64_t per_row = p.OW * p.C * g.kernel_h * g.kernel_w;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(per_row, 1));
  at::parallel_for(0, x.size(0) * p.OH, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(p.C));
    if constexpr (std::is_same_v<T, float>)
      pool_rows_float(p, begin, end, acc.data());
    else if constexpr (std::is_same_v<T, at::BFloat16>)
      pool_rows_bfloat16(p, begin, end, acc.data());
    else
      pool_rows_half(p, begin, end, acc.data());
  });
}

Outcome<at::Tensor> max_pool2d_cpu(const at::Tensor& input, const PoolGeometry& g) {
  if (!input.is_cpu()) return Decline{"cpu: not a CPU tensor"};
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    return Decline{"cpu: dtype (float32, bfloat16 or float16)"};
  if (at::GradMode::is_enabled() && input.requires_grad())
    return Decline{"cpu: autograd (no backward)"};
  // What ATen's output would be channels_last for; an NCHW map (or one both layouts describe)
  // keeps ATen's layout and path.
  if (input.dim() != 4 || input.suggest_memory_format() != at::MemoryFormat::ChannelsLast ||
      !input.is_contiguous(at::MemoryFormat::ChannelsLast))
    return Decline{"cpu: channels_last input only"};
  // The slot entry's checks again (a direct call of the handle), before the sizes that divide
  // by the stride.
  if (max_pool2d_problem(input, g)) return Decline{"cpu: geometry"};
  const int64_t oh = max_pool2d_output_size(input.size(2), g.kernel_h, g.pad_h, g.stride_h,
                                            g.dilation_h, g.ceil_mode);
  const int64_t ow = max_pool2d_output_size(input.size(3), g.kernel_w, g.pad_w, g.stride_w,
                                            g.dilation_w, g.ceil_mode);
  auto out = at::empty({input.size(0), input.size(1), oh, ow},
                       input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  if (dtype == at::kFloat)
    pool_all<float>(input, g, out);
  else if (dtype == at::kBFloat16)
    pool_all<at::BFloat16>(input, g, out);
  else
    pool_all<at::Half>(input, g, out);
  return out;
}

}  // namespace

void register_max_pool2d_cpu(Registry& registry) {
  registry.register_impl(
      kMaxPool2d, "cpu", &max_pool2d_cpu, [] { return true; }, &cpu_models_only);
}

}  // namespace libreyolo::kernels
