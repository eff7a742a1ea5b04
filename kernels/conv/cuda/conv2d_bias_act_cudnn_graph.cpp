// The `cudnn_graph` implementation of conv2d_bias_act: act(conv2d(x, w) + bias + residual) as one
// cuDNN operation graph, a convolution followed by pointwise ADD (bias), ADD (residual) and
// SWISH_FWD / GELU_FWD / TANH_FWD nodes, which cuDNN's runtime fusion engines compile into the
// convolution's epilogue (cudnn-frontend's graph API: include/cudnn_frontend/graph_interface.h
// of NVIDIA/cudnn-frontend; cuDNN developer guide, "Runtime Fusion Engines"). `cuda` runs the
// same as cudnn_convolution plus one epilogue kernel: one more launch and one more pass over the
// output per convolution (RT-DETR-R18's batch-1 forward: 38 such kernels, 0.1 of its 1.12 ms on
// an H100; docs/BENCHMARKS.md).
//
// Numerics: the convolution's float32 sum is not rounded to the output dtype before the bias and
// the activation (intermediate float32), so outputs differ from `cuda`'s by that one rounding.
// Float16 and bfloat16 only: float32 keeps `cuda`, whose cuDNN calls follow ATen's TF32 setting.
//
// Tuning: the first eager call of each geometry (sizes, strides, dtype, bias, residual,
// activation, device) builds heuristic A's first kMaxPlans buildable engine configs, checks each
// one's output against `cuda` on the call's own tensors, and times them against `cuda` with CUDA
// events behind a busy-wait kernel (GPU time, not the host's launch rate). The fastest plan that
// beats `cuda` serves the geometry; otherwise the geometry declines for the process, with the
// reason. Process-wide, like ATen's cuDNN benchmark cache: a measurement of this device.
#include "kernels/conv/cuda/conv2d_bias_act_cudnn_graph.h"

#include "kernels/registry.h"

#if defined(LIBREYOLO_WITH_CUDNN_FRONTEND)
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kernels/conv/cuda/conv2d_bias_act_cuda.h"
#include "kernels/cuda/busy_wait.h"
#include "kernels/cuda/event_pair.h"
#include "log/log.h"
#endif

namespace libreyolo::kernels {

#if defined(LIBREYOLO_WITH_CUDNN_FRONTEND)
namespace {

namespace fe = cudnn_frontend;

/// Engine configs built and timed per geometry (heuristic A's order, best guess first). Each
/// runtime fusion plan is compiled when built, so this bounds the first call's cost.
constexpr int64_t kMaxPlans = 3;
/// Launches per timed batch, and the busy-wait ahead of each batch (long enough for the host to
/// enqueue the batch while the GPU waits).
constexpr int kTimedRuns = 10;
constexpr int64_t kHoldNs = 3'000'000;
/// The most geometries kept (a daemon with dynamic shapes would otherwise tune every new one);
/// later ones decline to `cuda`.
constexpr std::size_t kMaxGeometries = 4096;

/// The graph's tensor uids (the variant pack's keys).
enum Uid : int64_t { kX = 1, kW = 2, kBias = 3, kResidual = 4, kY = 5 };

/// What one geometry was tuned to: a plan of a built graph, or the reason it declines.
struct Tuned {
  const char* declined = nullptr;
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t plan = -1;
  int64_t workspace = 0;
  /// Held while the plan executes: cuDNN's execution plans are not safe to execute from several
  /// threads at once (PyTorch keeps its own per thread after hangs: pytorch/pytorch#103939), and
  /// instances of one model on one GPU share this plan. Held for the host-side launch only.
  mutable std::mutex execute_mutex;
};

using Key = std::vector<int64_t>;

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<Key, std::shared_ptr<const Tuned>>& cache() {
  static std::map<Key, std::shared_ptr<const Tuned>> c;
  return c;
}
/// Held while a geometry is tuned: one tuning at a time, so that no two time each other's work.
std::mutex& tuning_mutex() {
  static std::mutex m;
  return m;
}

Key make_key(const at::Tensor& x, const at::Tensor& w, bool bias, const at::Tensor& residual,
             const ConvGeometry& g, Activation act) {
  Key k{x.device().index(),
        static_cast<int64_t>(x.scalar_type()),
        static_cast<int64_t>(act),
        bias,
        residual.defined(),
        g.stride_h,
        g.stride_w,
        g.pad_h,
        g.pad_w,
        g.dilation_h,
        g.dilation_w,
        g.groups};
  for (const auto& t : {x, w, residual}) {
    if (!t.defined()) continue;
    k.insert(k.end(), t.sizes().begin(), t.sizes().end());
    k.insert(k.end(), t.strides().begin(), t.strides().end());
  }
  return k;
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

/// The sizes of conv2d(x, w) with geometry g: (B, C_out, H', W').
std::vector<int64_t> output_sizes(const at::Tensor& x, const at::Tensor& w, const ConvGeometry& g) {
  const auto out = [](int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
  };
  return {x.size(0), w.size(0), out(x.size(2), w.size(2), g.stride_h, g.pad_h, g.dilation_h),
          out(x.size(3), w.size(3), g.stride_w, g.pad_w, g.dilation_w)};
}

/// The output of conv2d(x, w) with geometry g, in x's memory format.
at::Tensor empty_output(const at::Tensor& x, const at::Tensor& w, const ConvGeometry& g) {
  return at::empty(output_sizes(x, w, g), x.options().memory_format(x.suggest_memory_format()));
}

/// "BxCxHxW -> K kKh sS gG" for the debug log.
std::string describe(const at::Tensor& x, const at::Tensor& w, const ConvGeometry& g) {
  return std::to_string(x.size(0)) + "x" + std::to_string(x.size(1)) + "x" +
         std::to_string(x.size(2)) + "x" + std::to_string(x.size(3)) + " -> " +
         std::to_string(w.size(0)) + " k" + std::to_string(w.size(2)) + " s" +
         std::to_string(g.stride_h) + " g" + std::to_string(g.groups) +
         (x.is_contiguous(at::MemoryFormat::ChannelsLast) ? " nhwc" : " nchw");
}

/// The operation graph: conv_fprop, then + bias, + residual, activation; float32 in between.
std::shared_ptr<fe::graph::Graph> build_graph(const at::Tensor& x, const at::Tensor& w,
                                              const at::Tensor& bias, const at::Tensor& residual,
                                              const at::Tensor& y, const ConvGeometry& g,
                                              Activation act) {
  const auto io = x.scalar_type() == at::kHalf ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto tensor = [&](const at::Tensor& t, Uid uid, const char* name) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim(t.sizes().vec())
                             .set_stride(t.strides().vec())
                             .set_data_type(io));
  };
  auto out = graph->conv_fprop(tensor(x, kX, "x"), tensor(w, kW, "w"),
                               fe::graph::Conv_fprop_attributes()
                                   .set_name("conv")
                                   .set_pre_padding({g.pad_h, g.pad_w})
                                   .set_post_padding({g.pad_h, g.pad_w})
                                   .set_stride({g.stride_h, g.stride_w})
                                   .set_dilation({g.dilation_h, g.dilation_w}));
  const auto pointwise = [](fe::PointwiseMode_t mode, const char* name) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(
        fe::DataType_t::FLOAT);
  };
  if (bias.defined()) {
    const int64_t k = bias.size(0);
    auto b = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("bias")
                               .set_uid(kBias)
                               .set_dim({1, k, 1, 1})
                               .set_stride({k, 1, k, k})
                               .set_data_type(io));
    out = graph->pointwise(out, b, pointwise(fe::PointwiseMode_t::ADD, "add_bias"));
  }
  if (residual.defined())
    out = graph->pointwise(out, tensor(residual, kResidual, "residual"),
                           pointwise(fe::PointwiseMode_t::ADD, "add_residual"));
  switch (act) {
    case Activation::silu:
      out = graph->pointwise(
          out, pointwise(fe::PointwiseMode_t::SWISH_FWD, "silu").set_swish_beta(1.0f));
      break;
    case Activation::gelu:  // erf form, as kernels/conv/conv2d_bias_act.h's
      out = graph->pointwise(out, pointwise(fe::PointwiseMode_t::GELU_FWD, "gelu"));
      break;
    case Activation::tanh:
      out = graph->pointwise(out, pointwise(fe::PointwiseMode_t::TANH_FWD, "tanh"));
      break;
    default:
      break;
  }
  out->set_output(true)
      .set_uid(kY)
      .set_dim(y.sizes().vec())
      .set_stride(y.strides().vec())
      .set_data_type(io);
  return graph;
}

/// build_graph, validated, with heuristic A's engine configs listed (none built yet); null when
/// cuDNN rejects the graph or has no engine config for it.
std::shared_ptr<fe::graph::Graph> planned_graph(cudnnHandle_t handle, const at::Tensor& x,
                                                const at::Tensor& w, const at::Tensor& bias,
                                                const at::Tensor& residual, const at::Tensor& y,
                                                const ConvGeometry& g, Activation act) {
  auto graph = build_graph(x, w, bias, residual, y, g, act);
  if (graph->validate().is_bad() || graph->build_operation_graph(handle).is_bad() ||
      graph->create_execution_plans({fe::HeurMode_t::A}).is_bad())
    return nullptr;
  return graph;
}

/// Milliseconds per run of `run` on `stream`, GPU time: kTimedRuns launches enqueued behind a
/// busy-wait kernel, between two events. +infinity when a run or the timing fails.
template <class Run>
float time_ms(cudaStream_t stream, const cuda::EventPair& events, Run&& run) {
  if (!events.ok() || cuda::busy_wait(stream, kHoldNs) != cudaSuccess ||
      cudaEventRecord(events.start, stream) != cudaSuccess)
    return std::numeric_limits<float>::infinity();
  bool ran = true;
  for (int r = 0; r < kTimedRuns && ran; ++r) ran = run();
  float ms = 0.0f;
  if (cudaEventRecord(events.stop, stream) != cudaSuccess ||
      cudaEventSynchronize(events.stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, events.start, events.stop) != cudaSuccess || !ran)
    return std::numeric_limits<float>::infinity();
  return ms / kTimedRuns;
}

/// The call's cuDNN handle (ATen's, per thread and device) on the current stream.
cudnnHandle_t current_handle() {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  if (cudnnSetStream(handle, at::cuda::getCurrentCUDAStream()) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  return handle;
}

/// Runs plan `plan` of `graph` into y. False when cuDNN fails.
bool execute(const fe::graph::Graph& graph, int64_t plan, int64_t workspace, cudnnHandle_t handle,
             const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
             const at::Tensor& residual, at::Tensor& y) {
  std::unordered_map<int64_t, void*> pack{
      {kX, x.data_ptr()}, {kW, w.data_ptr()}, {kY, y.data_ptr()}};
  if (bias.defined()) pack.emplace(kBias, bias.data_ptr());
  if (residual.defined()) pack.emplace(kResidual, residual.data_ptr());
  at::Tensor ws;
  if (workspace > 0) ws = at::empty({workspace}, x.options().dtype(at::kByte));
  return graph.execute_plan_at_index(handle, pack, workspace > 0 ? ws.data_ptr() : nullptr, plan)
      .is_good();
}

/// |fused - reference| <= 2^-6 |reference| + 2^-9 max|reference| elementwise (NaN disagrees):
/// the extra rounding of `cuda`'s 16-bit convolution output, with room. On tune()'s synthetic
/// operands a wrong layout, a missing bias (|b| up to 0.5) or residual is far outside it.
bool agrees(const at::Tensor& fused, const at::Tensor& reference) {
  const auto f = fused.to(at::kFloat), r = reference.to(at::kFloat);
  const double scale = std::max(r.abs().max().item<double>(), 1e-3);
  return (f - r).abs().le(r.abs() * (1.0 / 64) + scale / 512).all().item<bool>();
}

/// A tensor of `like`'s sizes, strides, dtype and device holding sin(i * freq) * scale: spread,
/// deterministic values (no random generator state touched) for checking and timing plans. The
/// caller's own first call is often the daemon's warm-up on zeros, on which any plan agrees.
at::Tensor synthetic(const at::Tensor& like, double freq, double scale) {
  if (!like.defined()) return like;
  const auto values =
      at::sin(at::arange(like.numel(), like.options().dtype(at::kFloat)) * freq) * scale;
  return at::empty_like(like).copy_(values.view(like.sizes()));
}

std::shared_ptr<const Tuned> tune(const at::Tensor& x_in, const at::Tensor& w_in,
                                  const at::Tensor& bias_in, const at::Tensor& residual_in,
                                  const ConvGeometry& g, Activation act) {
  // Operands of the call's sizes and strides with values of a trained layer's scale (weights
  // by fan-in), so that the sums, the bias and the residual all matter.
  const double fan_in = static_cast<double>(w_in.size(1) * w_in.size(2) * w_in.size(3));
  const at::Tensor x = synthetic(x_in, 0.7548776662, 1.0);
  const at::Tensor w = synthetic(w_in, 0.5698402910, std::sqrt(3.0 / fan_in));
  const at::Tensor bias = synthetic(bias_in, 0.3819660113, 0.5);
  const at::Tensor residual = synthetic(residual_in, 0.6180339887, 1.0);
  const auto declined = [](const char* why) {
    auto t = std::make_shared<Tuned>();
    t->declined = why;
    return std::shared_ptr<const Tuned>(std::move(t));
  };
  const auto no_engine = [&] {
    log::debug("cudnn_graph: conv2d_bias_act " + describe(x, w, g) + ": no cuDNN engine");
    return declined("cudnn_graph: cuDNN has no engine for this graph");
  };
  const auto t0 = std::chrono::steady_clock::now();
  cudnnHandle_t handle = current_handle();
  if (!handle) return declined("cudnn_graph: cudnnSetStream failed");
  auto y = empty_output(x, w, g);
  auto graph = planned_graph(handle, x, w, bias, residual, y, g, act);
  if (!graph) return no_engine();
  std::vector<int64_t> plans;
  for (int64_t i = 0;
       i < graph->get_execution_plan_count() && static_cast<int64_t>(plans.size()) < kMaxPlans; ++i)
    if (graph->build_plan_at_index(i).is_good()) plans.push_back(i);
  if (plans.empty()) return no_engine();

  // `cuda` on the same tensors: the reference output and the time to beat.
  const auto reference_outcome = cuda::conv2d_bias_act_cuda(x, w, bias, residual, g, act);
  if (std::holds_alternative<Decline>(reference_outcome))
    return declined("cudnn_graph: `cuda` declines this geometry (nothing to compare with)");
  const at::Tensor reference = std::get<at::Tensor>(reference_outcome);
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  const cuda::EventPair events;
  const auto run_cuda = [&] {
    return !std::holds_alternative<Decline>(
        cuda::conv2d_bias_act_cuda(x, w, bias, residual, g, act));
  };
  float best_cuda = time_ms(stream, events, run_cuda);

  auto tuned = std::make_shared<Tuned>();
  float best = std::numeric_limits<float>::infinity();
  for (const int64_t plan : plans) {
    int64_t workspace = 0;
    if (graph->get_workspace_size_plan_at_index(plan, workspace).is_bad()) continue;
    y.fill_(std::numeric_limits<float>::quiet_NaN());  // a plan that writes nothing disagrees
    if (!execute(*graph, plan, workspace, handle, x, w, bias, residual, y)) continue;
    if (!agrees(y, reference)) {
      log::warn("cudnn_graph: conv2d_bias_act plan " + std::to_string(plan) +
                " disagrees with `cuda`; not used");
      continue;
    }
    const float ms = time_ms(stream, events, [&] {
      return execute(*graph, plan, workspace, handle, x, w, bias, residual, y);
    });
    if (ms < best) {
      best = ms;
      tuned->plan = plan;
      tuned->workspace = workspace;
    }
  }
  best_cuda = std::min(best_cuda, time_ms(stream, events, run_cuda));  // once more: noise
  const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::debug("cudnn_graph: conv2d_bias_act " + describe(x, w, g) + ": fused " +
             std::to_string(best * 1e3f) + " us, cuda " + std::to_string(best_cuda * 1e3f) +
             " us, tuned in " + std::to_string(spent) + " s");
  if (tuned->plan < 0) return declined("cudnn_graph: no plan ran and agreed with `cuda`");
  if (!(best < best_cuda)) return declined("cudnn_graph: slower than `cuda` on this geometry");
  tuned->graph = std::move(graph);
  return tuned;
}

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

/// The implementation's capability checks; on success `residual` is the caller's residual in
/// the input's memory format (copied when it was in another).
const char* check(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& residual_in, const ConvGeometry& g, Activation act,
                  at::Tensor& residual) {
  if (!input.is_cuda()) return "cudnn_graph: not a CUDA tensor";
  const auto dtype = input.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16)
    return "cudnn_graph: float16 / bfloat16 only (float32 runs `cuda`)";
  if (act == Activation::relu)
    return "cudnn_graph: ReLU (`cuda` fuses it through cudnn_convolution_relu)";
  if (!bias.defined() && !residual_in.defined() && act == Activation::none)
    return "cudnn_graph: nothing to fuse (no bias, residual or activation)";
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad()))
    return "cudnn_graph: autograd (the fused op has no backward)";
  if (weight.scalar_type() != dtype || (bias.defined() && bias.scalar_type() != dtype) ||
      (residual_in.defined() && residual_in.scalar_type() != dtype))
    return "cudnn_graph: weight, bias or residual dtype differs from the input's";
  if (input.dim() != 4 || weight.dim() != 4 ||
      (bias.defined() &&
       (bias.dim() != 1 || !bias.is_contiguous() || bias.size(0) != weight.size(0))))
    return "cudnn_graph: shapes (4-d input and weight, contiguous (C_out) bias)";
  if (residual_in.defined() &&
      residual_in.sizes() != at::IntArrayRef(output_sizes(input, weight, g)))
    return "cudnn_graph: residual not of the output's shape";
  if (input.device() != weight.device() || (bias.defined() && bias.device() != input.device()) ||
      (residual_in.defined() && residual_in.device() != input.device()))
    return "cudnn_graph: tensors on different devices";
  const auto& ctx = at::globalContext();
  if (ctx.deterministicCuDNN() || ctx.deterministicAlgorithms())
    return "cudnn_graph: deterministic algorithms requested (plans are not filtered for them)";
  const auto format = input.suggest_memory_format();
  if (!input.is_contiguous(format)) return "cudnn_graph: input not contiguous in its memory format";
  residual = residual_in;
  if (residual.defined() && !residual.is_contiguous(format)) residual = residual.contiguous(format);
  if (!aligned16(input) || !aligned16(weight) || !aligned16(bias) || !aligned16(residual))
    return "cudnn_graph: a tensor is not 16-byte aligned";

  return nullptr;
}

Outcome<at::Tensor> conv2d_bias_act_cudnn_graph(const at::Tensor& input, const at::Tensor& weight,
                                                const at::Tensor& bias,
                                                const at::Tensor& residual_in,
                                                const ConvGeometry& g, Activation act) {
  at::Tensor residual;
  if (const char* why = check(input, weight, bias, residual_in, g, act, residual))
    return Decline{why};
  const c10::cuda::CUDAGuard device_guard(input.device());
  const Key key = make_key(input, weight, bias.defined(), residual, g, act);
  std::shared_ptr<const Tuned> tuned;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(key);
    if (it != cache().end()) tuned = it->second;
  }
  if (!tuned) {
    if (capturing())
      return Decline{"cudnn_graph: not tuned yet (first call inside a CUDA graph capture)"};
    std::lock_guard<std::mutex> tuning(tuning_mutex());
    {
      std::lock_guard<std::mutex> lock(cache_mutex());
      const auto it = cache().find(key);
      if (it != cache().end())
        tuned = it->second;
      else if (cache().size() >= kMaxGeometries)
        return Decline{"cudnn_graph: too many geometries tuned (later ones run `cuda`)"};
    }
    if (!tuned) {
      try {
        tuned = tune(input, weight, bias, residual, g, act);
      } catch (const std::exception& e) {
        log::warn(std::string("cudnn_graph: tuning conv2d_bias_act failed: ") + e.what());
        auto t = std::make_shared<Tuned>();
        t->declined = "cudnn_graph: tuning failed (see the log)";
        tuned = std::move(t);
      }
      std::lock_guard<std::mutex> lock(cache_mutex());
      cache().emplace(key, tuned);
    }
  }
  if (tuned->declined) return Decline{tuned->declined};
  cudnnHandle_t handle = current_handle();
  if (!handle) return Decline{"cudnn_graph: cudnnSetStream failed"};
  auto y = empty_output(input, weight, g);
  const std::lock_guard<std::mutex> one_launch(tuned->execute_mutex);
  if (!execute(*tuned->graph, tuned->plan, tuned->workspace, handle, input, weight, bias, residual,
               y))
    return Decline{"cudnn_graph: cuDNN execution failed"};
  return y;
}

}  // namespace

namespace cuda {

bool cudnn_graph_built() { return true; }

Outcome<at::Tensor> conv2d_bias_act_cudnn_graph_untimed(const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const at::Tensor& bias,
                                                        const at::Tensor& residual_in,
                                                        const ConvGeometry& g, Activation act) {
  at::Tensor residual;
  if (const char* why = check(input, weight, bias, residual_in, g, act, residual))
    return Decline{why};
  const c10::cuda::CUDAGuard device_guard(input.device());
  cudnnHandle_t handle = current_handle();
  if (!handle) return Decline{"cudnn_graph: cudnnSetStream failed"};
  auto y = empty_output(input, weight, g);
  auto graph = planned_graph(handle, input, weight, bias, residual, y, g, act);
  if (!graph) return Decline{"cudnn_graph: cuDNN has no engine for this graph"};
  for (int64_t i = 0; i < graph->get_execution_plan_count(); ++i) {
    int64_t workspace = 0;
    if (graph->build_plan_at_index(i).is_bad() ||
        graph->get_workspace_size_plan_at_index(i, workspace).is_bad())
      continue;
    if (!execute(*graph, i, workspace, handle, input, weight, bias, residual, y))
      return Decline{"cudnn_graph: cuDNN execution failed"};
    return y;
  }
  return Decline{"cudnn_graph: cuDNN has no engine for this graph"};
}

CudnnGraphTuned cudnn_graph_tuned() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  CudnnGraphTuned t;
  t.geometries = cache().size();
  for (const auto& [key, tuned] : cache()) t.fused += tuned->declined == nullptr;
  return t;
}

}  // namespace cuda
#else   // LIBREYOLO_WITH_CUDNN_FRONTEND

namespace cuda {

bool cudnn_graph_built() { return false; }

Outcome<at::Tensor> conv2d_bias_act_cudnn_graph_untimed(const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const at::Tensor&,
                                                        const ConvGeometry&, Activation) {
  return Decline{"cudnn_graph: not built (no cudnn-frontend headers)"};
}

CudnnGraphTuned cudnn_graph_tuned() { return {}; }

}  // namespace cuda
#endif  // LIBREYOLO_WITH_CUDNN_FRONTEND

void register_conv2d_bias_act_cudnn_graph(Registry& registry) {
#if defined(LIBREYOLO_WITH_CUDNN_FRONTEND)
  registry.register_impl(
      kConv2dBiasAct, "cudnn_graph", &conv2d_bias_act_cudnn_graph,
      [] { return at::cuda::is_available(); }, cuda_models_only);
#else
  (void)registry;  // built without cudnn-frontend's headers (kernels/CMakeLists.txt)
#endif
}

}  // namespace libreyolo::kernels
