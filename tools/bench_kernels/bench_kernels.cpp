// Benchmarks of the `cuda` implementations of ms_deform_attn and fake_quant_fp8 on the shapes the
// families run (Deformable DETR decoder/encoder at 800x1333, RT-DETR decoder at 640), of the
// conv2d_bias_act epilogue and max_pool2d on RT-DETR's batch-32 640 maps, of the depthwise
// convolutions of D-FINE L's HGNetV2-B4 at batch 32 and 640, of FP8 execute's quantisation and
// GEMM on ViT-B and LW-DETR shapes, and of the portable paths (ATen)
// and a device-to-device copy of the same bytes in the same run.
//
// Method (results: docs/bench/kernels.md): each measured call is captured N times into one CUDA
// graph, the graph is replayed R times between two CUDA events, time per call = elapsed / (N * R);
// warm clocks (warm-up replays first), inputs resident in L2 when they fit ("warm"). The "cold"
// figure adds an L2 flush (a 256 MB memset) before every call inside the graph and subtracts the
// flush's own time measured alone.
//
// Usage: bench_kernels [--json FILE]
//   [--ops msda,fake_quant,bias_act,max_pool,depthwise,layer_norm,window_layer_norm,fp8_gemm]
// (default: all)
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention/cuda/ms_deform_attn_cuda.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/bias_act_cuda.h"
#include "kernels/conv/cuda/depthwise_conv2d_cuda.h"
#include "kernels/gemm/cuda/fp8_quant_rows_cuda.h"
#include "kernels/gemm/fp8_gemm.h"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/norm/cuda/add_layer_norm_cuda.h"
#include "kernels/pool/cuda/max_pool2d_cuda.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/quant/cuda/fake_quant_fp8_cuda.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "models/swin/windows.h"

namespace lk = libreyolo::kernels;

namespace {

constexpr double kCopyTBs = 4.3;  // D2D copy rate measured on this H200 (KINDS.md)

struct Row {
  std::string op, shape, impl, dtype, method;
  double us = 0, us_cold = -1, mbytes = 0;
};
std::vector<Row> rows;

/// Microseconds per call of fn, from CUDA-graph replays (see the file comment).
double time_graph(const std::function<void()>& fn, int per_graph = 20, int replays = 20,
                  const std::function<void()>& before = {}) {
  auto stream = at::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(stream);
  for (int i = 0; i < 3; ++i) fn();
  stream.synchronize();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  for (int i = 0; i < per_graph; ++i) {
    if (before) before();
    fn();
  }
  graph.capture_end();
  for (int i = 0; i < 3; ++i) graph.replay();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record(stream);
  for (int i = 0; i < replays; ++i) graph.replay();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) * 1000.0 / (per_graph * replays);
}

/// Microseconds per call of fn run eagerly (host dispatch included when it is the bottleneck).
double time_eager(const std::function<void()>& fn, int iters = 20) {
  auto stream = at::cuda::getCurrentCUDAStream();
  for (int i = 0; i < 3; ++i) fn();
  stream.synchronize();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record(stream);
  for (int i = 0; i < iters; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) * 1000.0 / iters;
}

at::Tensor flush_buffer() {
  // Never destroyed: a static tensor would be freed after the CUDA context at exit.
  static auto* buf = new at::Tensor(
      at::empty({256 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA)));
  return *buf;
}
double flush_us() {
  static double us = time_graph([] { flush_buffer().zero_(); });
  return us;
}

/// Warm (L2-resident) and cold times of fn.
std::pair<double, double> time_both(const std::function<void()>& fn) {
  const double warm = time_graph(fn);
  const double with_flush = time_graph(fn, 20, 10, [] { flush_buffer().zero_(); });
  return {warm, with_flush - flush_us()};
}

double mb(const at::Tensor& t) { return t.nbytes() / 1e6; }

struct Msda {
  lk::SpatialShapes levels;
  at::Tensor value, shapes, starts, loc, attn;
};

/// Realistic sampling: reference point = the query's own pixel centre (encoder) or uniform
/// (decoder), offsets ~ N(0, 2) pixels of each level, weights softmax-ed over L*P.
Msda make_msda(int64_t B, int64_t Q, int64_t H, int64_t C, const lk::SpatialShapes& levels,
               int64_t P, bool encoder, at::ScalarType vt, at::ScalarType lt,
               bool correlated = false) {
  at::manual_seed(0);
  const auto dev = at::Device(at::kCUDA, 0);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  int64_t S = 0;
  for (const auto& l : levels) S += l[0] * l[1];
  const int64_t L = static_cast<int64_t>(levels.size());
  at::Tensor ref;
  if (encoder) {
    std::vector<at::Tensor> parts;
    for (const auto& l : levels) {
      auto ys = (at::arange(l[0], f32) + 0.5) / l[0];
      auto xs = (at::arange(l[1], f32) + 0.5) / l[1];
      auto grid = at::meshgrid({ys, xs}, "ij");
      parts.push_back(at::stack({grid[1].reshape(-1), grid[0].reshape(-1)}, -1));
    }
    ref = at::cat(parts).view({1, S, 1, 1, 1, 2}).expand({B, S, 1, 1, 1, 2});
  } else {
    ref = at::rand({B, Q, 1, 1, 1, 2}, f32);
  }
  std::vector<double> wh;
  for (const auto& l : levels)
    wh.push_back(static_cast<double>(l[1])), wh.push_back(static_cast<double>(l[0]));
  const auto size = at::tensor(wh, f32).view({1, 1, 1, L, 1, 2});
  Msda m;
  m.levels = levels;
  m.value = at::randn({B, S, H, C}, f32).to(vt);
  // iid offsets (no two queries share corners: the worst case for caches), or "correlated": one
  // offset pattern per (head, level, point) shared by all queries plus 0.25 px of noise, as
  // neighbouring encoder pixels with similar features produce.
  const auto offsets = correlated ? at::randn({1, 1, H, L, P, 2}, f32) * 2.0 +
                                        at::randn({B, Q, H, L, P, 2}, f32) * 0.25
                                  : at::randn({B, Q, H, L, P, 2}, f32) * 2.0;
  m.loc = (ref + offsets / size).to(lt).contiguous();
  m.attn = at::softmax(at::randn({B, Q, H, L * P}, f32), -1).view({B, Q, H, L, P}).to(lt);
  m.shapes = lk::spatial_shapes_tensor(levels, dev);
  m.starts = lk::level_start_index(levels, dev);
  return m;
}

std::string dtype_name(at::ScalarType vt, at::ScalarType lt) {
  std::string v = vt == at::kFloat ? "fp32" : vt == at::kHalf ? "fp16" : "bf16";
  std::string l = lt == at::kFloat ? "fp32" : lt == at::kHalf ? "fp16" : "bf16";
  return v == l ? v : v + "/loc " + l;
}

void bench_msda(const std::string& shape, int64_t B, int64_t Q, const lk::SpatialShapes& levels,
                bool encoder, const std::vector<std::pair<at::ScalarType, at::ScalarType>>& fwd,
                const std::vector<std::pair<at::ScalarType, at::ScalarType>>& bwd, bool portable) {
  const int64_t H = 8, C = 32, P = 4;
  int64_t S = 0;
  for (const auto& l : levels) S += l[0] * l[1];
  if (encoder) Q = S;
  for (const bool correlated : {false, true}) {
    if (correlated && !encoder) continue;  // decoder queries are independent objects
    const std::string sh = shape + (encoder ? (correlated ? " corr" : " iid") : "");
    for (const auto& [vt, lt] : fwd) {
      auto m = make_msda(B, Q, H, C, levels, P, encoder, vt, lt, correlated);
      auto run = [&] {
        lk::cuda::ms_deform_attn_forward(m.value, m.shapes, m.starts, m.loc, m.attn);
      };
      const double bytes =
          mb(m.value) + mb(m.loc) + mb(m.attn) + B * Q * H * C * m.value.element_size() / 1e6;
      for (const int variant : {0, 1}) {  // 0: msda_forward_v2 (default), 1: first kernel
        lk::cuda::set_forward_variant(variant);
        const auto [warm, cold] = time_both(run);
        rows.push_back({"ms_deform_attn fwd", sh, variant == 0 ? "cuda" : "cuda v1",
                        dtype_name(vt, lt), "graph", warm, cold, bytes});
      }
      lk::cuda::set_forward_variant(0);
    }
  }
  for (const bool correlated : {false, true}) {
    if (correlated && !encoder) continue;
    const std::string sh = shape + (encoder ? (correlated ? " corr" : " iid") : "");
    for (const auto& [vt, lt] : bwd) {
      auto m = make_msda(B, Q, H, C, levels, P, encoder, vt, lt, correlated);
      const auto grad_out = at::randn({B, Q, H * C}, m.value.options());
      auto run = [&] {
        lk::cuda::ms_deform_attn_backward(m.value, m.shapes, m.starts, m.loc, m.attn, grad_out);
      };
      const auto [warm, cold] = time_both(run);
      const double gv32 = m.value.numel() * 4 / 1e6;
      double bytes = mb(m.value) + 2 * mb(m.loc) + 2 * mb(m.attn) + mb(grad_out) + 2 * gv32;
      if (vt != at::kFloat) bytes += gv32 + mb(m.value);  // the float32 -> 16-bit cast
      rows.push_back(
          {"ms_deform_attn bwd", sh, "cuda", dtype_name(vt, lt), "graph", warm, cold, bytes});
    }
  }
  {  // the float32 grad_value zero fill the backward starts with (part of its time)
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    const double us = time_graph([&] { at::zeros({B, S, H, C}, opts); });
    rows.push_back(
        {"zeros grad_value", shape, "aten", "fp32", "graph", us, -1, B * S * H * C * 4 / 1e6});
  }
  if (portable) {
    auto m = make_msda(B, Q, H, C, levels, P, encoder, at::kFloat, at::kFloat);
    auto run = [&] { lk::ms_deform_attn_portable(m.value, m.levels, m.loc, m.attn); };
    // Eager: the portable path may synchronise (not capturable in general).
    const std::string method = "eager";
    const double us = time_eager(run);
    const double bytes = mb(m.value) + mb(m.loc) + mb(m.attn) + B * Q * H * C * 4 / 1e6;
    rows.push_back({"ms_deform_attn fwd", shape, "portable", "fp32", method, us, -1, bytes});
    auto v = m.value.clone().requires_grad_();
    auto l = m.loc.clone().requires_grad_();
    auto a = m.attn.clone().requires_grad_();
    auto out = lk::ms_deform_attn_portable(v, m.levels, l, a);
    const auto g = at::randn_like(out);
    const double bwd_us = time_eager(
                              [&] {
                                auto o = lk::ms_deform_attn_portable(v, m.levels, l, a);
                                o.backward(g);
                              },
                              5) -
                          us;
    rows.push_back(
        {"ms_deform_attn bwd", shape, "portable", "fp32", "eager (fwd+bwd) - fwd", bwd_us, -1, 0});
  }
}

void bench_fake_quant() {
  const int64_t rows_n = 8192, cols = 8192;  // 64 M float32 = 256 MB, well past the L2
  const auto x = at::randn({rows_n, cols}, at::TensorOptions().device(at::kCUDA)) * 10;
  const auto s1 = at::full({1}, 0.05f, x.options());
  const auto sc = (x.abs().amax({1}, true) / 448.0).contiguous();
  auto y = at::empty_like(x);
  const double bytes = 2 * mb(x);
  const double copy = time_graph([&] { y.copy_(x); }, 10, 10);
  rows.push_back({"d2d copy", "8192x8192", "aten", "fp32", "graph", copy, -1, bytes});
  rows.push_back({"fake_quant_fp8", "8192x8192 per-tensor", "cuda", "fp32", "graph",
                  time_graph([&] { lk::cuda::fake_quant_fp8_forward(x, s1); }, 10, 10), -1, bytes});
  rows.push_back({"fake_quant_fp8", "8192x8192 per-channel", "cuda", "fp32", "graph",
                  time_graph([&] { lk::cuda::fake_quant_fp8_forward(x, sc); }, 10, 10), -1, bytes});
  rows.push_back({"fake_quant_fp8", "8192x8192 per-tensor", "reference", "fp32", "graph",
                  time_graph([&] { lk::fake_quant_fp8_reference(x, s1); }, 10, 10), -1, bytes});
}

/// The epilogue on RT-DETR-R50's batch-32 bf16 encoder maps (channels_last): bias + SiLU, and
/// bias + residual + SiLU; against ATen's add_ / silu_ on the same map and a copy of as many
/// bytes (the bandwidth anchor). Bytes: the map read and written, plus the residual read.
void bench_bias_act() {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (const auto& [shape, hw] : {std::pair<const char*, int64_t>{"32x256x80x80 CL", 80},
                                  std::pair<const char*, int64_t>{"32x256x40x40 CL", 40}}) {
    auto y = at::randn({32, 256, hw, hw}, opts).contiguous(at::MemoryFormat::ChannelsLast);
    const auto residual = at::randn_like(y);
    const auto bias = at::randn({256}, opts);
    const auto bias4 = bias.view({1, 256, 1, 1});
    auto dst = at::empty_like(y);
    const double two = 2 * mb(y), three = 3 * mb(y);
    rows.push_back({"d2d copy", shape, "aten", "bf16", "graph",
                    time_graph([&] { dst.copy_(y); }, 10, 10), -1, two});
    rows.push_back(
        {"bias_act silu", shape, "cuda", "bf16", "graph",
         time_graph([&] { lk::cuda::bias_act_(y, bias, {}, lk::Activation::silu); }, 10, 10), -1,
         two});
    rows.push_back({"bias_act silu", shape, "aten", "bf16", "graph",
                    time_graph([&] { at::silu_(y.add_(bias4)); }, 10, 10), -1, two});
    rows.push_back(
        {"bias_act res+silu", shape, "cuda", "bf16", "graph",
         time_graph([&] { lk::cuda::bias_act_(y, bias, residual, lk::Activation::silu); }, 10, 10),
         -1, three});
    rows.push_back({"bias_act res+silu", shape, "aten", "bf16", "graph",
                    time_graph([&] { at::silu_(y.add_(bias4).add_(residual)); }, 10, 10), -1,
                    three});
  }
}

/// The ResNet stem pooling (3x3, stride 2, padding 1) on RT-DETR's batch-32 640 stem output,
/// 32 x 64 x 320 x 320 bf16 channels_last: ours against at::max_pool2d (which also writes the
/// int64 indices). Bytes: the input read once and the output written once.
void bench_max_pool() {
  const auto x = at::randn({32, 64, 320, 320}, at::TensorOptions().device(at::kCUDA))
                     .to(at::kBFloat16)
                     .contiguous(at::MemoryFormat::ChannelsLast);
  lk::PoolGeometry g;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  const double bytes = mb(x) * 1.25;
  rows.push_back({"max_pool2d 3x3 s2", "32x64x320x320 CL", "cuda", "bf16", "graph",
                  time_graph([&] { lk::cuda::max_pool2d_nhwc(x, g); }, 10, 10), -1, bytes});
  rows.push_back({"max_pool2d 3x3 s2", "32x64x320x320 CL", "aten", "bf16", "graph",
                  time_graph([&] { lk::max_pool2d_portable(x, g); }, 10, 10), -1, bytes});
}

/// FP8 execute's parts on ViT-B/16 batch 32 (6,304 tokens) and LW-DETR small batch 32 (51,200
/// tokens of 192): the activation quantisation (kernels/gemm/cuda/fp8_quant_rows_cuda.h) against
/// quantize_fp8_rows' ATen ops and a copy of as many bytes (bf16 read, e4m3 written), and the GEMM:
/// the bfloat16 at::linear against at::_scaled_mm alone and with the quantisation (what the
/// `scaled_mm` fp8_gemm runs per Linear). Bytes of the GEMM rows: both operands read, y written.
void bench_fp8_gemm() {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  struct Case {
    const char* shape;
    int64_t m, k, n;
  };
  for (const auto& c : {Case{"6304x768->2304 (ViT-B qkv)", 6304, 768, 2304},
                        Case{"6304x768->3072 (ViT-B fc1)", 6304, 768, 3072},
                        Case{"6304x3072->768 (ViT-B fc2)", 6304, 3072, 768},
                        Case{"51200x192->768 (LW-DETR fc1)", 51200, 192, 768}}) {
    const auto x = at::randn({c.m, c.k}, opts);
    const auto w = at::randn({c.n, c.k}, opts) / std::sqrt(double(c.k));
    const auto bias = at::randn({c.n}, opts);
    const auto w8 = lk::quantize_fp8_weight(w);
    const auto ws = w8.scale.view({1, c.n});
    const double q_bytes = mb(x) * 1.5;
    auto dst =
        at::empty({c.m * c.k * 3 / 2}, at::TensorOptions().device(at::kCUDA).dtype(at::kByte));
    const auto src = at::empty_like(dst);
    rows.push_back({"d2d copy", c.shape, "aten", "bf16->e4m3", "graph",
                    time_graph([&] { dst.copy_(src); }, 10, 10), -1, q_bytes});
    rows.push_back({"fp8 quantize rows", c.shape, "cuda", "bf16->e4m3", "graph",
                    time_graph([&] { lk::cuda::quantize_fp8_rows_bf16(x); }, 10, 10), -1, q_bytes});
    rows.push_back({"fp8 quantize rows", c.shape, "aten", "bf16->e4m3", "graph",
                    time_graph([&] { lk::quantize_fp8_rows(x); }, 10, 10), -1, q_bytes});
    const double g_bytes = (c.m * c.k + c.n * c.k + c.m * c.n) * 2 / 1e6;
    rows.push_back({"linear", c.shape, "aten", "bf16", "graph",
                    time_graph([&] { at::linear(x, w, bias); }, 10, 10), -1, g_bytes});
    const auto [xq, xs] = lk::cuda::quantize_fp8_rows_bf16(x);
    auto scaled_mm = [&](const at::Tensor& a, const at::Tensor& as) {
      return at::_scaled_mm(a, w8.data.t(), as, ws, bias, std::nullopt, at::kBFloat16, false);
    };
    rows.push_back({"scaled_mm", c.shape, "aten", "e4m3 rowwise", "graph",
                    time_graph([&] { scaled_mm(xq, xs); }, 10, 10), -1, g_bytes});
    rows.push_back({"quantize+scaled_mm", c.shape, "cuda+aten", "e4m3 rowwise", "graph",
                    time_graph(
                        [&] {
                          const auto [q, qs] = lk::cuda::quantize_fp8_rows_bf16(x);
                          scaled_mm(q, qs);
                        },
                        10, 10),
                    -1, g_bytes});
  }
}

/// add_layer_norm on the ViT-backbone rows of a batch-32 forward (bf16): RF-DETR base (51,328
/// tokens of 768: 32 images x 4 windows x 401), RF-DETR nano (18,560 x 384), LW-DETR small
/// (51,200 x 192). The layer-scaled residual add + LayerNorm (x, delta read; sum, norm written)
/// against ATen's mul, add and layer_norm, and the plain LayerNorm against at::layer_norm; a copy
/// of as many bytes is the bandwidth anchor.
void bench_add_layer_norm() {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  struct Case {
    const char* shape;
    int64_t rows, d;
  };
  for (const auto& c :
       {Case{"51328x768 (RF-DETR base)", 51328, 768}, Case{"18560x384 (RF-DETR nano)", 18560, 384},
        Case{"51200x192 (LW-DETR small)", 51200, 192}}) {
    const auto x = at::randn({c.rows, c.d}, opts), delta = at::randn({c.rows, c.d}, opts);
    const auto scale = at::rand({c.d}, opts), w = at::rand({c.d}, opts), b = at::rand({c.d}, opts);
    auto dst = at::empty({2 * c.rows, c.d}, opts);
    const auto src = at::randn({2 * c.rows, c.d}, opts);
    const double four = 2 * mb(src);  // x, delta read; sum, norm written
    rows.push_back({"d2d copy", c.shape, "aten", "bf16", "graph",
                    time_graph([&] { dst.copy_(src); }, 10, 10), -1, four});
    rows.push_back(
        {"add+scale+layer_norm", c.shape, "cuda", "bf16", "graph",
         time_graph([&] { lk::cuda::add_layer_norm(x, delta, scale, w, b, 1e-6); }, 10, 10), -1,
         four});
    rows.push_back(
        {"add+scale+layer_norm", c.shape, "aten", "bf16", "graph",
         time_graph([&] { lk::add_layer_norm_portable(x, delta, scale, w, b, 1e-6); }, 10, 10), -1,
         four});
    const double two = mb(src);
    rows.push_back({"layer_norm", c.shape, "cuda", "bf16", "graph",
                    time_graph([&] { lk::cuda::add_layer_norm(x, {}, {}, w, b, 1e-6); }, 10, 10),
                    -1, two});
    rows.push_back({"layer_norm", c.shape, "aten", "bf16", "graph",
                    time_graph([&] { at::layer_norm(x, {c.d}, w, b, 1e-6); }, 10, 10), -1, two});
  }
}

/// add_layer_norm's row orders on Swin-T stage 1 of Grounding DINO tiny at batch 8 and
/// 800x1333 (bf16; 200 x 334 tokens of 96 per image, window 7, shift 3: the padded 203 x 336
/// map, 29 x 48 windows): (1) the LayerNorm written straight into the rolled, padded window order
/// against ATen's layer_norm, constant_pad_nd, roll and window_partition (the unfused block's
/// ops), and (2) the attention output read back from the window order, added to the residual and
/// normalised against window_reverse, roll, the crop's contiguous, add and layer_norm; a copy
/// of the fused kernel's bytes is the bandwidth anchor.
void bench_window_layer_norm() {
  namespace swin = libreyolo::models::swin;
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const int64_t B = 8, H = 200, W = 334, C = 96, ws = 7, s = 3, hp = 203, wp = 336;
  const char* shape = "8x200x334x96 w7 s3 (Swin-T)";
  const auto order = swin::window_rows(H, W, ws, s, false, at::Device(at::kCUDA));
  const auto x = at::randn({B, H * W, C}, opts), w = at::rand({C}, opts), b = at::rand({C}, opts);
  const auto a = at::randn({B, order.rows.numel(), C}, opts);
  const double image = mb(x), windowed = mb(a);
  auto copy_row = [&](double bytes) {
    auto src = at::empty({static_cast<int64_t>(bytes * 1e6 / 4)}, opts);
    auto dst = at::empty_like(src);
    rows.push_back({"d2d copy", shape, "aten", "bf16", "graph",
                    time_graph([&] { dst.copy_(src); }, 10, 10), -1, bytes});
  };
  // (1) x read, the window order written.
  copy_row(image + windowed);
  rows.push_back(
      {"ln+roll+pad+part", shape, "cuda", "bf16", "graph",
       time_graph([&] { lk::cuda::add_layer_norm(x, {}, {}, w, b, 1e-5, order.rows); }, 10, 10), -1,
       image + windowed});
  rows.push_back(
      {"ln+roll+pad+part", shape, "aten", "bf16", "graph",
       time_graph(
           [&] {
             auto h = at::layer_norm(x, {C}, w, b, 1e-5).view({B, H, W, C});
             h = at::roll(at::constant_pad_nd(h, {0, 0, 0, wp - W, 0, hp - H}), {-s, -s}, {1, 2});
             swin::window_partition(h, ws);
           },
           10, 10),
       -1, image + windowed});
  // (2) x and the window-order output's image rows read, sum and norm written.
  copy_row(4 * image);
  rows.push_back(
      {"rev+roll+crop+add+ln", shape, "cuda", "bf16", "graph",
       time_graph([&] { lk::cuda::add_layer_norm(x, a, {}, w, b, 1e-5, {}, order.inverse); }, 10,
                  10),
       -1, 4 * image});
  rows.push_back(
      {"rev+roll+crop+add+ln", shape, "aten", "bf16", "graph",
       time_graph(
           [&] {
             auto r = at::roll(swin::window_reverse(a.view({-1, ws, ws, C}), ws, hp, wp), {s, s},
                               {1, 2});
             const auto y = x + r.slice(1, 0, H).slice(2, 0, W).contiguous().view({B, H * W, C});
             at::layer_norm(y, {C}, w, b, 1e-5);
           },
           10, 10),
       -1, 4 * image});
}

/// The depthwise convolutions of D-FINE L (HGNetV2-B4 backbone, hybrid encoder of 256
/// channels) at batch 32 and 640 x 640 input, bf16 channels_last: the stage downsamples (3x3
/// stride 2 on the stride-4/8/16 maps of 160/80/40), the light blocks' 5x5 stride 1 (on the
/// stride-16/32 maps of 40/20; 18 and 6 of them per forward), the encoder's SCDown (3x3 stride
/// 2), and 512 x 40 x 40 5x5 (the kernel's target: >= 2 TB/s). Each against ATen's at::conv2d
/// with bias (cuDNN, benchmark mode, as the daemon runs it: its grouped kernel and the NHWC <->
/// NCHW transforms around it) and a device-to-device copy of as many bytes. cuda_depthwise runs
/// with bias and no activation (the downsample's form; the activation is free in this
/// memory-bound kernel). Bytes: the input read and the output written once.
void bench_depthwise() {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  struct Shape {
    const char* name;
    int64_t C, H, k, stride;
  };
  const Shape shapes[] = {
      {"32x128x160x160 3x3 s2", 128, 160, 3, 2}, {"32x512x80x80 3x3 s2", 512, 80, 3, 2},
      {"32x1024x40x40 3x3 s2", 1024, 40, 3, 2},  {"32x192x40x40 5x5 s1", 192, 40, 5, 1},
      {"32x384x20x20 5x5 s1", 384, 20, 5, 1},    {"32x256x80x80 3x3 s2", 256, 80, 3, 2},
      {"32x256x40x40 3x3 s2", 256, 40, 3, 2},    {"32x512x40x40 5x5 s1", 512, 40, 5, 1},
  };
  auto& ctx = at::globalContext();
  const bool benchmark = ctx.benchmarkCuDNN();
  ctx.setBenchmarkCuDNN(true);
  for (const auto& s : shapes) {
    const auto x = at::randn({32, s.C, s.H, s.H}, opts).contiguous(at::MemoryFormat::ChannelsLast);
    const auto w = at::randn({s.C, 1, s.k, s.k}, opts).contiguous(at::MemoryFormat::ChannelsLast);
    const auto b = at::randn({s.C}, opts);
    lk::ConvGeometry g;
    g.stride_h = g.stride_w = s.stride;
    g.pad_h = g.pad_w = s.k / 2;
    g.groups = s.C;
    const auto khwc = lk::cuda::depthwise_weight_khwc(w);
    const auto y =
        lk::cuda::depthwise_conv2d_nhwc(x, khwc, s.k, s.k, b, {}, g, lk::Activation::none);
    const double bytes = mb(x) + mb(y);
    // The copy moves bytes / 2 each way: as many bytes read and written as the convolution.
    const auto src = at::empty({(x.numel() + y.numel()) / 2}, opts);
    auto dst = at::empty_like(src);
    const auto [copy_warm, copy_cold] = time_both([&] { dst.copy_(src); });
    rows.push_back({"d2d copy", s.name, "aten", "bf16", "graph", copy_warm, copy_cold, bytes});
    const auto [dw_warm, dw_cold] = time_both([&] {
      lk::cuda::depthwise_conv2d_nhwc(x, khwc, s.k, s.k, b, {}, g, lk::Activation::none);
    });
    rows.push_back(
        {"depthwise conv", s.name, "cuda_depthwise", "bf16", "graph", dw_warm, dw_cold, bytes});
    const auto [at_warm, at_cold] = time_both([&] {
      at::conv2d(x, w, b, {s.stride, s.stride}, {s.k / 2, s.k / 2}, {1, 1}, s.C);
    });
    rows.push_back({"depthwise conv", s.name, "aten", "bf16", "graph", at_warm, at_cold, bytes});
  }
  ctx.setBenchmarkCuDNN(benchmark);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path,
      ops = "msda,fake_quant,bias_act,max_pool,depthwise,layer_norm,window_layer_norm,fp8_gemm";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];
    if (std::string(argv[i]) == "--ops" && i + 1 < argc) ops = argv[++i];
  }
  auto wanted = [&](const std::string& op) {
    return ("," + ops + ",").find("," + op + ",") != std::string::npos;
  };
  if (!at::cuda::is_available()) {
    std::cerr << "bench_kernels: no CUDA device\n";
    return 1;
  }
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  const lk::SpatialShapes ddetr = {{100, 167}, {50, 84}, {25, 42}, {13, 21}};
  const lk::SpatialShapes rtdetr = {{80, 80}, {40, 40}, {20, 20}};
  const auto f32 = std::make_pair(at::kFloat, at::kFloat);
  const auto bf16 = std::make_pair(at::kBFloat16, at::kBFloat16);
  const auto f16 = std::make_pair(at::kHalf, at::kHalf);
  const auto bf16_f32 = std::make_pair(at::kBFloat16, at::kFloat);
  try {
    if (wanted("msda")) {
      bench_msda("ddetr decoder B4 Q300", 4, 300, ddetr, false, {f32, bf16, f16, bf16_f32},
                 {f32, bf16}, true);
      bench_msda("ddetr encoder B1 Q22223", 1, 0, ddetr, true, {f32, bf16, bf16_f32}, {f32, bf16},
                 true);
      bench_msda("rtdetr decoder 640 B32 Q300", 32, 300, rtdetr, false, {f32, bf16}, {f32}, true);
    }
    if (wanted("fake_quant")) bench_fake_quant();
    if (wanted("bias_act")) bench_bias_act();
    if (wanted("max_pool")) bench_max_pool();
    if (wanted("layer_norm")) bench_add_layer_norm();
    if (wanted("window_layer_norm")) bench_window_layer_norm();
    if (wanted("depthwise")) bench_depthwise();
    if (wanted("fp8_gemm") && prop->major * 10 + prop->minor >= 89) bench_fp8_gemm();
  } catch (const std::exception& e) {
    std::cerr << "bench_kernels failed: " << e.what() << "\n";
  }
  std::printf(
      "GPU %s (%d SMs), LibTorch %s; warm = inputs in L2, cold = L2 flushed before each call\n",
      prop->name, prop->multiProcessorCount, LIBREYOLO_TORCH_VERSION);
  std::printf("%-20s %-30s %-14s %-14s %10s %10s %9s %9s\n", "op", "shape", "impl", "dtype",
              "warm us", "cold us", "MB", "TB/s");
  for (const auto& r : rows) {
    const double t = r.us_cold > 0 ? r.us_cold : r.us;
    std::printf("%-20s %-30s %-14s %-14s %10.2f %10.2f %9.1f %9.2f\n", r.op.c_str(),
                r.shape.c_str(), r.impl.c_str(), r.dtype.c_str(), r.us, r.us_cold, r.mbytes,
                r.mbytes / t);
  }
  if (!json_path.empty()) {
    std::ofstream os(json_path);
    os << "{\"gpu\": \"" << json_escape(prop->name) << "\", \"libtorch\": \""
       << LIBREYOLO_TORCH_VERSION << "\", \"copy_tb_s_reference\": " << kCopyTBs
       << ", \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      os << "  {\"op\": \"" << json_escape(r.op) << "\", \"shape\": \"" << json_escape(r.shape)
         << "\", \"impl\": \"" << r.impl << "\", \"dtype\": \"" << json_escape(r.dtype)
         << "\", \"method\": \"" << json_escape(r.method) << "\", \"us\": " << r.us
         << ", \"us_cold\": " << r.us_cold << ", \"mbytes\": " << r.mbytes << "}"
         << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    os << "]}\n";
  }
  return 0;
}
