// bench_attention: attention alone on CUDA, the manual math of models/layers/attention against
// at::scaled_dot_product_attention (SDPA) formulations, at three shape classes:
//   vit_b        batch 32, 12 heads, 197 tokens, d 64, no bias
//   swin_shift   Swin-T stage 1 shifted windows: 2048 windows (32 images x 64), 3 heads,
//                49 tokens, d 32, relative position bias [3,49,49] + the -100 shift mask [64,49,49]
//   swin_plain   the same windows without shift: bias [1,3,49,49] broadcast (every other block)
//   aifi         RT-DETR AIFI: batch 8, 8 heads, 400 tokens, d 32, no bias
//   lwdetr_global / lwdetr_window   LW-DETR small's ViT: batch 32, 12 heads, d 16, 1,600 tokens /
//                512 windows of 100 tokens, no bias
//   decoder_self RT-DETR / D-FINE decoder self-attention: batch 32, 8 heads, 300 queries, d 32
//   rfdetr_m_glb / rfdetr_m_win / rfdetr_b_win   RF-DETR's DINOv2 at batch 32, 6 heads,
//                d 64: medium's global blocks (1,300 tokens) and windows (128 x 325), base's
//                windows (512 x 101), no bias
// in float32 (TF32 off), float16 and bfloat16. Method (docs/bench/attention.md): every call is
// captured `per_graph` times into one CUDA graph, the graph is replayed between two CUDA events;
// time per call = elapsed / calls; median of `repeats` such measurements. Inputs are the ones the
// model passes (q/k/v as views of the projection output, the bias as Swin builds it). Each row
// gives the SDPA backend at::_fused_sdp_choice reports, the time, the speed-up over the manual
// row of the same shape and dtype, and max |out - reference| (reference: the manual math in
// float64 on the same inputs) and max |out - manual|. In a build with the CUDA kernels the
// `cuda_flash` row is the attention slot's own kernel
// (kernels/attention/cuda/flash_attention_cuda.h). Usage: bench_attention [--json FILE] [--repeats
// N] [--only SHAPE] [--dtype fp32|fp16|bf16] [--cpu-check]
// (--cpu-check: every variant once on the CPU, correctness columns only, no timing.)
// Without a CUDA device it prints "bench_attention: skipped (no CUDA device)" and exits 0.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "models/layers/attention.h"
#ifdef LIBREYOLO_BENCH_FLASH_ATTENTION
#include "kernels/attention/cuda/flash_attention_cuda.h"
#endif
#include "models/swin/windows.h"

namespace layers = libreyolo::models::layers;
namespace swin = libreyolo::models::swin;

namespace {

int g_repeats = 5;
bool g_cpu_check = false;  ///< --cpu-check: every variant once on the CPU, no timing

/// Microseconds per call of fn: CUDA-graph replays between CUDA events (file comment); the
/// median of g_repeats measurements. Falls back to back-to-back eager calls when the capture
/// fails (`method` says which).
double time_call(const std::function<void()>& fn, std::string& method, int per_graph = 10,
                 int replays = 10) {
  auto stream = at::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(stream);
  for (int i = 0; i < 3; ++i) fn();
  stream.synchronize();
  std::vector<double> us;
  at::cuda::CUDAGraph graph;
  try {
    graph.capture_begin();
    for (int i = 0; i < per_graph; ++i) fn();
    graph.capture_end();
    for (int i = 0; i < 3; ++i) graph.replay();
    for (int r = 0; r < g_repeats; ++r) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record(stream);
      for (int i = 0; i < replays; ++i) graph.replay();
      stop.record(stream);
      stop.synchronize();
      us.push_back(start.elapsed_time(stop) * 1000.0 / (per_graph * replays));
    }
    method = "graph";
  } catch (const std::exception&) {
    // Leave capture mode (the stream and the allocator) before timing eagerly.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      try {
        graph.capture_end();
      } catch (const std::exception&) {
      }
    }
    (void)cudaGetLastError();
    stream.synchronize();
    us.clear();
    for (int r = 0; r < g_repeats; ++r) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record(stream);
      for (int i = 0; i < per_graph * replays; ++i) fn();
      stop.record(stream);
      stop.synchronize();
      us.push_back(start.elapsed_time(stop) * 1000.0 / (per_graph * replays));
    }
    method = "eager";
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

const char* backend_name(int64_t b) {
  switch (b) {
    case 0:
      return "math";
    case 1:
      return "flash";
    case 2:
      return "efficient";
    case 3:
      return "cudnn";
    case 4:
      return "overrideable";
    default:
      return "error";
  }
}

/// Enables exactly one SDPA backend ("" = leave the defaults) for its lifetime.
class BackendGuard {
 public:
  explicit BackendGuard(const std::string& only) : active_(!only.empty()) {
    auto& c = at::globalContext();
    flash_ = c.userEnabledFlashSDP();
    eff_ = c.userEnabledMemEfficientSDP();
    math_ = c.userEnabledMathSDP();
    cudnn_ = c.userEnabledCuDNNSDP();
    if (!active_) return;
    c.setSDPUseFlash(only == "flash");
    c.setSDPUseMemEfficient(only == "efficient");
    c.setSDPUseMath(only == "math");
    c.setSDPUseCuDNN(only == "cudnn");
  }
  ~BackendGuard() {
    if (!active_) return;
    auto& c = at::globalContext();
    c.setSDPUseFlash(flash_);
    c.setSDPUseMemEfficient(eff_);
    c.setSDPUseMath(math_);
    c.setSDPUseCuDNN(cudnn_);
  }

 private:
  bool active_, flash_ = true, eff_ = true, math_ = true, cudnn_ = true;
};

struct Row {
  std::string shape, dtype, variant, backend, method, note;
  double us = -1, speedup = 0, diff_ref = -1, diff_manual = -1;
};

/// One formulation: `run` returns (B*nW or B, H, L, d); `sdpa_args` (optional) gives the
/// q, k, v, mask SDPA sees, for at::_fused_sdp_choice; `force` selects one SDPA backend.
struct Variant {
  std::string name;
  std::function<at::Tensor()> run;
  std::function<std::vector<at::Tensor>()> sdpa_args;
  std::string force;
  std::string note;
};

struct Shape {
  std::string name;
  int64_t batch, heads, tokens, dim;
  int64_t windows = 0;  ///< windows per image (Swin)
  bool shift = false;   ///< Swin: -100 mask of the shifted windows
};

std::string dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "fp32" : t == at::kHalf ? "fp16" : "bf16";
}

std::vector<Row> bench_shape(const Shape& s, at::ScalarType dt) {
  at::manual_seed(0);
  const auto dev = g_cpu_check ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(dev);
  const int64_t BW = s.windows ? s.batch * s.windows : s.batch;  // attention batch
  const int64_t H = s.heads, L = s.tokens, d = s.dim, nW = s.windows;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // q/k/v as AttentionImpl makes them: projection output (BW, L, H*d) viewed (BW, H, L, d).
  auto proj = [&] {
    return at::randn({BW, L, H * d}, f64).to(dt).view({BW, L, H, d}).transpose(1, 2);
  };
  const auto q = proj(), k = proj(), v = proj();
  at::Tensor bias;  // what the model passes: window bias (nW, H, L, L) or (1, H, L, L)
  int64_t bias_windows = 0;
  if (s.windows) {
    // Relative position bias: a trained table's magnitude (|b| ~ 1..5); shift mask 0 / -100.
    const auto pos = (at::randn({1, H, L, L}, f64) * 2.0);
    bias = pos;
    if (s.shift) {
      const int64_t side = static_cast<int64_t>(std::lround(std::sqrt(double(nW)))) *
                           static_cast<int64_t>(std::lround(std::sqrt(double(L))));
      const int64_t ws = static_cast<int64_t>(std::lround(std::sqrt(double(L))));
      const auto mask = swin::shifted_window_mask(side, side, ws, ws / 2, at::kDouble, dev);
      bias = pos + mask.unsqueeze(1);  // (nW, H, L, L), exactly Swin's sum
      bias_windows = nW;
    }
  }
  // Reference: manual math in float64 on the same (rounded) inputs, bias expanded.
  at::Tensor bias_full64;
  if (bias.defined())
    bias_full64 = bias_windows
                      ? bias.unsqueeze(0).expand({s.batch, nW, H, L, L}).reshape({BW, H, L, L})
                      : bias;
  const auto ref =
      layers::dot_product_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble),
                                    bias_full64, scale, layers::AttentionPath::kManual);
  // The bias in the model's dtype: Swin builds it in the activations' dtype.
  const auto bias_dt = bias.defined() ? bias.to(dt) : at::Tensor();
  const auto bias_full = bias_full64.defined() ? bias_full64.to(dt).contiguous() : at::Tensor();
  auto padded = [&](const at::Tensor& m) {  // rows padded to 16 elements, sliced back
    const int64_t n = m.size(-1), p = (n + 15) / 16 * 16;
    auto sizes = m.sizes().vec();
    sizes.back() = p;
    auto st = at::zeros(sizes, m.options());
    auto view = st.slice(-1, 0, n);
    view.copy_(m);
    return view;
  };
  const auto bias_full_padded = bias_full.defined() ? padded(bias_full) : at::Tensor();

  using P = layers::AttentionPath;
  auto lib = [&](P path) {
    return [&, path] {
      return layers::dot_product_attention(q, k, v, bias_dt, scale, path, false, bias_windows);
    };
  };
  auto sdpa_with = [&](const at::Tensor& mask) {
    return [&, mask] {
      return at::scaled_dot_product_attention(
          q, k, v, mask.defined() ? std::optional(mask) : std::nullopt, 0.0, false, scale);
    };
  };
  std::vector<Variant> vs;
  vs.push_back({"manual", lib(P::kManual), {}, "", "models/layers/attention manual math"});
  const std::vector<std::string> backends = {"flash", "efficient", "cudnn", "math"};
  if (!bias_windows) {
    const auto mask = bias_dt;  // undefined or (1, H, L, L)
    vs.push_back({"sdpa", lib(P::kSdpa),
                  [=] {
                    return std::vector<at::Tensor>{q, k, v, mask};
                  },
                  "", "SDPA, default backend choice"});
    vs.push_back({"mem_efficient",
                  lib(P::kMemEfficient),
                  {},
                  "",
                  "efficient kernel called directly, aligned mask (the policy for a bias)"});
    if (mask.defined()) {
      const auto kept = layers::prepare_attention_bias(mask, 0, dt, P::kMemEfficient);
      vs.push_back({"mem_efficient_kept",
                    [&, kept] {
                      return layers::dot_product_attention(q, k, v, kept, scale, P::kMemEfficient);
                    },
                    {},
                    "",
                    "the policy as Swin runs it: aligned bias kept per block"});
      const auto mp = padded(mask);
      vs.push_back({"sdpa_padded_mask", lib(P::kSdpaPaddedMask),
                    [=] {
                      return std::vector<at::Tensor>{q, k, v, mp};
                    },
                    "", "(c) bias rows padded to 16 (copy per call of the small bias)"});
    }
    for (const auto& b : backends)
      vs.push_back({"sdpa[" + b + "]", sdpa_with(mask),
                    [=] {
                      return std::vector<at::Tensor>{q, k, v, mask};
                    },
                    b, "(d) SDPA forced to one backend"});
  } else {
    // Swin before the fused-attention policy: the bias expanded to (BW, H, L, L) per call, outside.
    vs.push_back({"manual_old_swin",
                  [&] {
                    const auto full =
                        bias_dt.unsqueeze(0).expand({s.batch, nW, H, L, L}).reshape({BW, H, L, L});
                    return layers::dot_product_attention(q, k, v, full, scale, P::kManual);
                  },
                  {},
                  "",
                  "manual, bias materialised per image per call (Swin before)"});
    vs.push_back({"manual_inplace",
                  [&] {
                    auto w = at::matmul(q, k.transpose(2, 3));
                    w.mul_(scale);
                    w.view({s.batch, nW, H, L, L}).add_(bias_dt.unsqueeze(0));
                    at::_softmax_out(w, w, -1, false);
                    return at::matmul(w, v);
                  },
                  {},
                  "",
                  "(e) manual, scale/bias/softmax in place"});
    vs.push_back({"sdpa_expanded", lib(P::kSdpa),
                  [&] {
                    return std::vector<at::Tensor>{q, k, v, bias_full};
                  },
                  "",
                  "(a) SDPA, mask expanded to (BW,H,L,L) per call (what fused_attn ran before)"});
    vs.push_back({"sdpa_expanded_prebuilt", sdpa_with(bias_full),
                  [&] {
                    return std::vector<at::Tensor>{q, k, v, bias_full};
                  },
                  "", "(a) kernel + SDPA's own pad of the unaligned mask, no expansion"});
    vs.push_back({"sdpa_padded_mask", lib(P::kSdpaPaddedMask),
                  [&] {
                    return std::vector<at::Tensor>{q, k, v, bias_full_padded};
                  },
                  "", "(c) mask expanded once into 16-aligned rows per call"});
    vs.push_back({"mem_efficient",
                  lib(P::kMemEfficient),
                  {},
                  "",
                  "efficient kernel called directly, aligned expanded mask built per call"});
    const auto kept = layers::prepare_attention_bias(bias_dt, BW, dt, P::kMemEfficient);
    vs.push_back({"mem_efficient_kept",
                  [&, kept] {
                    return layers::dot_product_attention(q, k, v, kept, scale, P::kMemEfficient,
                                                         false, BW);
                  },
                  {},
                  "",
                  "the policy as Swin runs it: prepared mask kept per block (no per-call copy)"});
    vs.push_back({"sdpa_padded_prebuilt", sdpa_with(bias_full_padded),
                  [&] {
                    return std::vector<at::Tensor>{q, k, v, bias_full_padded};
                  },
                  "", "(c) kernel alone on an aligned (BW,H,L,L) mask"});
    // (b) windows x heads as SDPA's head axis; the mask broadcast over the images.
    auto batch = [&](const at::Tensor& x) {
      return x.reshape({s.batch, nW, H, L, d}).reshape({s.batch, nW * H, L, d}).contiguous();
    };
    const auto qb = batch(q), kb = batch(k), vb = batch(v);
    const auto mb = padded(bias_dt.expand({nW, H, L, L}).contiguous()).view({1, nW * H, L, L});
    const auto mb_unpadded = bias_dt.expand({nW, H, L, L}).contiguous().view({1, nW * H, L, L});
    vs.push_back({"sdpa_window_batch", lib(P::kSdpaWindowBatch),
                  [=] {
                    return std::vector<at::Tensor>{qb, kb, vb, mb};
                  },
                  "", "(b) (B,nW*H,L,d) layout, mask [1,nW*H,L,L]; q/k/v copies included"});
    auto wb = [&, qb, kb, vb](const at::Tensor& m) {
      return [&, qb, kb, vb, m] {
        return at::scaled_dot_product_attention(qb, kb, vb, m, 0.0, false, scale)
            .reshape({BW, H, L, d});
      };
    };
    vs.push_back({"sdpa_window_batch_kernel", wb(mb),
                  [=] {
                    return std::vector<at::Tensor>{qb, kb, vb, mb};
                  },
                  "", "(b)+(c) kernel alone: contiguous (B,nW*H,L,d), aligned broadcast mask"});
    vs.push_back({"sdpa_window_batch_unpadded", wb(mb_unpadded),
                  [=] {
                    return std::vector<at::Tensor>{qb, kb, vb, mb_unpadded};
                  },
                  "", "(b) kernel + SDPA's pad of the small broadcast mask"});
    // Token-major windows (B, L, nW, H, d): the layout a window partition could emit directly;
    // (B, nW*H, L, d) is then a strided view, no copy at all.
    auto token_major = [&](const at::Tensor& x) {
      auto t = at::empty({s.batch, L, nW, H, d}, x.options());
      t.copy_(x.reshape({s.batch, nW, H, L, d}).permute({0, 3, 1, 2, 4}));
      return t.view({s.batch, L, nW * H, d}).transpose(1, 2);
    };
    const auto qt = token_major(q), kt = token_major(k), vt = token_major(v);
    vs.push_back({"sdpa_window_batch_strided",
                  [&, qt, kt, vt, mb] {
                    return at::scaled_dot_product_attention(qt, kt, vt, mb, 0.0, false, scale)
                        .reshape({BW, H, L, d});
                  },
                  [=] {
                    return std::vector<at::Tensor>{qt, kt, vt, mb};
                  },
                  "", "(b) token-major windows: strided view, no q/k/v copy"});
    // Backend ops called directly (a per-call choice, no global flags): the mask expanded to
    // the full 4-D shape as SDPA's preprocess_mask does.
    const auto mb_full = mb.expand({s.batch, nW * H, L, L});
    // Called directly the cuDNN op does not refuse float32: it returns NaN (measured), skip it.
    if (dt != at::kFloat) {
      vs.push_back({"cudnn_op_window_batch",
                    [&, qb, kb, vb, mb_full] {
                      return std::get<0>(at::_scaled_dot_product_cudnn_attention(
                                             qb, kb, vb, mb_full, false, 0.0, false, false, scale))
                          .reshape({BW, H, L, d});
                    },
                    {},
                    "",
                    "at::_scaled_dot_product_cudnn_attention, broadcast aligned mask"});
      vs.push_back({"cudnn_op_expanded",
                    [&] {
                      return std::get<0>(at::_scaled_dot_product_cudnn_attention(
                          q, k, v, bias_full_padded, false, 0.0, false, false, scale));
                    },
                    {},
                    "",
                    "at::_scaled_dot_product_cudnn_attention, aligned expanded mask"});
    }
    vs.push_back({"efficient_op_window_batch",
                  [&, qb, kb, vb, mb_full] {
                    return std::get<0>(at::_scaled_dot_product_efficient_attention(
                                           qb, kb, vb, mb_full, false, 0.0, false, scale))
                        .reshape({BW, H, L, d});
                  },
                  {},
                  "",
                  "at::_scaled_dot_product_efficient_attention, broadcast aligned mask"});
    vs.push_back({"manual_baddbmm",
                  [&] {
                    // bias + scale * q k^T in the GEMM epilogue (one pass less than manual).
                    auto w = at::baddbmm(
                        bias_dt.unsqueeze(0).expand({s.batch, nW, H, L, L}).reshape({BW * H, L, L}),
                        q.reshape({BW * H, L, d}), k.reshape({BW * H, L, d}).transpose(1, 2), 1.0,
                        scale);
                    at::_softmax_out(w, w, -1, false);
                    return at::bmm(w, v.reshape({BW * H, L, d})).view({BW, H, L, d});
                  },
                  {},
                  "",
                  "(e) baddbmm: bias + scale*qk^T fused in cuBLAS, softmax in place"});
    for (const auto& b : backends) {
      vs.push_back({"sdpa_expanded_prebuilt[" + b + "]", sdpa_with(bias_full_padded),
                    [&] {
                      return std::vector<at::Tensor>{q, k, v, bias_full_padded};
                    },
                    b, "(d) aligned expanded mask, one backend"});
      vs.push_back({"sdpa_window_batch_kernel[" + b + "]", wb(mb),
                    [=] {
                      return std::vector<at::Tensor>{qb, kb, vb, mb};
                    },
                    b, "(d) broadcast mask, one backend"});
    }
  }
#ifdef LIBREYOLO_BENCH_FLASH_ATTENTION
  // The slot's `cuda` kernel called directly, at every head dim it is built for (the slot
  // takes only the ones where it wins: kernels/attention/cuda/flash_attention_cuda.cpp).
  if (!bias.defined() && !g_cpu_check && dt != at::kFloat &&
      libreyolo::kernels::cuda::flash_attention_supports_head_dim(d))
    vs.push_back({"cuda_flash",
                  [&] { return libreyolo::kernels::cuda::flash_attention(q, k, v, scale); },
                  {},
                  "",
                  "kernels/attention/cuda/flash_attention_kernels.cu"});
#endif
  // What a fused module runs: the `attention` slot bound for a model on this device.
  libreyolo::kernels::BindContext context;
  context.device = q.is_cuda() ? libreyolo::kernels::BindContext::Device::cuda
                               : libreyolo::kernels::BindContext::Device::cpu;
  const auto handle =
      libreyolo::kernels::Registry::process_default().bind(libreyolo::kernels::kAttention, context);
  vs.push_back({"policy(fused_attn=true)",
                [=] {
                  return libreyolo::kernels::attention(handle, true, q, k, v, bias_dt,
                                                       {scale, false, bias_windows});
                },
                {},
                "",
                ""});
  const layers::BiasKind kind = !bias.defined() ? layers::BiasKind::kNone
                                : bias_windows  ? layers::BiasKind::kWindow
                                                : layers::BiasKind::kDense;
  vs.back().note = std::string("runs ") + layers::attention_path_name(layers::attention_path(
                                              c10::DeviceType::CUDA, dt, kind, L, d));

  std::vector<Row> rows;
  at::Tensor manual_out;
  double manual_us = -1;
  for (const auto& var : vs) {
    Row r;
    r.shape = s.name;
    r.dtype = dtype_name(dt);
    r.variant = var.name;
    r.note = var.note;
    r.backend = "-";
    BackendGuard guard(var.force);
    try {
      if (var.sdpa_args) {
        const auto a = var.sdpa_args();
        r.backend = backend_name(at::_fused_sdp_choice(
            a[0], a[1], a[2], a[3].defined() ? std::optional(a[3]) : std::nullopt, 0.0, false,
            scale));
      }
      const auto out = var.run();
      if (!g_cpu_check) at::cuda::getCurrentCUDAStream().synchronize();
      r.diff_ref = (out.to(at::kDouble) - ref).abs().max().item<double>();
      if (var.name == "manual") manual_out = out;
      if (manual_out.defined())
        r.diff_manual =
            (out.to(at::kDouble) - manual_out.to(at::kDouble)).abs().max().item<double>();
      if (g_cpu_check)
        r.method = "cpu-check";
      else
        r.us = time_call([&] { (void)var.run(); }, r.method);
      if (var.name == "manual") manual_us = r.us;
      if (manual_us > 0) r.speedup = manual_us / r.us;
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      std::string msg = e.what();
      msg = msg.substr(0, msg.find('\n'));
      r.method = "unsupported";
      r.note = msg.substr(0, 160);
    }
    rows.push_back(r);
    std::cout << std::left << std::setw(14) << r.shape << std::setw(5) << r.dtype << std::setw(40)
              << r.variant << std::setw(10) << r.backend << std::right << std::setw(10)
              << std::fixed << std::setprecision(1) << r.us << std::setw(8) << std::setprecision(2)
              << r.speedup << "x" << std::setw(11) << std::scientific << std::setprecision(2)
              << r.diff_ref << std::setw(11) << r.diff_manual << "  " << std::left << r.method
              << "  " << r.note << std::defaultfloat << "\n"
              << std::flush;
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only, only_dtype;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--repeats" && i + 1 < argc) {
      g_repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--cpu-check") {
      g_cpu_check = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "fp32" || std::string(argv[i + 1]) == "fp16" ||
                std::string(argv[i + 1]) == "bf16")) {
      only_dtype = argv[++i];
    } else {
      std::cerr << "usage: bench_attention [--json FILE] [--repeats N] [--only SHAPE] [--dtype "
                   "fp32|fp16|bf16] [--cpu-check]\n";
      return 2;
    }
  }
  if (!g_cpu_check && (!at::hasCUDA() || !at::cuda::is_available())) {
    std::cout << "bench_attention: skipped (no CUDA device)\n";
    return 0;
  }
  // float32 rows measure float32 arithmetic: no TF32 in cuBLAS (manual, SDPA math) or cuDNN.
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const std::string device_name =
      g_cpu_check ? "cpu (--cpu-check)" : at::cuda::getCurrentDeviceProperties()->name;
  std::cout << "device " << device_name << ", LibTorch " << LIBREYOLO_TORCH_VERSION
            << ", median of " << g_repeats << " x (10 graph replays x 10 calls)\n";
  std::cout << std::left << std::setw(14) << "shape" << std::setw(5) << "dt" << std::setw(40)
            << "variant" << std::setw(10) << "backend" << std::right << std::setw(10) << "us"
            << std::setw(9) << "speedup" << std::setw(11) << "|d ref|" << std::setw(11)
            << "|d manual|"
            << "  method  note\n";
  const std::vector<Shape> shapes = {
      {"vit_b", 32, 12, 197, 64},
      {"swin_shift", 32, 3, 49, 32, 64, true},
      {"swin_plain", 32, 3, 49, 32, 64, false},
      {"aifi", 8, 8, 400, 32},
      // LW-DETR small (issue 27): ViT of 12 heads x 16, 1,600 tokens in its global blocks and
      // 16 windows of 100 tokens per image in the others (models/lw_detr/vit_backbone.cpp).
      {"lwdetr_global", 32, 12, 1600, 16},
      {"lwdetr_window", 512, 12, 100, 16},
      // RT-DETR / D-FINE decoder self-attention: 300 queries, 8 heads x 32.
      {"decoder_self", 32, 8, 300, 32},
      // RF-DETR's DINOv2 (6 heads x 64, models/rf_detr/dinov2_backbone.cpp): medium 576 (2 x 2
      // windows of 1 + 18 x 18 tokens; its global blocks see the 4 windows as one sequence) and
      // base 560 (4 x 4 windows of 1 + 10 x 10).
      {"rfdetr_m_glb", 32, 6, 1300, 64},
      {"rfdetr_m_win", 128, 6, 325, 64},
      {"rfdetr_b_win", 512, 6, 101, 64},
  };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : shapes) {
    if (!only.empty() && s.name != only) continue;
    for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
      if (!only_dtype.empty() && dtype_name(dt) != only_dtype) continue;
      for (const auto& r : bench_shape(s, dt)) {
        out.push_back({{"shape", r.shape},
                       {"dtype", r.dtype},
                       {"variant", r.variant},
                       {"backend", r.backend},
                       {"us", r.us},
                       {"speedup_vs_manual", r.speedup},
                       {"max_abs_diff_vs_fp64", r.diff_ref},
                       {"max_abs_diff_vs_manual", r.diff_manual},
                       {"method", r.method},
                       {"note", r.note}});
      }
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc = {{"device", device_name},
                          {"libtorch", LIBREYOLO_TORCH_VERSION},
                          {"repeats", g_repeats},
                          {"rows", out}};
    std::ofstream f(json_path);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::cerr << "bench_attention: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}
