// The `cuda_depthwise` implementation of conv2d_bias_act
// (kernels/conv/cuda/depthwise_conv2d_cuda.h): depthwise convolutions of channels_last CUDA tensors
// in one kernel with their bias, residual and activation, no layout transposes. Registered after
// `cuda`, so it is tried first (newest first); everything it declines (NCHW, grouped or dense
// convolutions, other dtypes, kernels over 7x7, strides over 2, autograd) runs `cuda` or the
// portable path.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/depthwise_conv2d_cuda.h"
#include "kernels/cuda/verified_once.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

using cuda::Verified;

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

/// The (kh * kw, C) weight of a (C, 1, kh, kw) weight tensor, made once per weight tensor: the
/// models' weights are long-lived parameters, and the copy is a launch per convolution
/// otherwise. An entry is valid while the weight's TensorImpl is alive (a weak reference, which
/// also keeps the address from being reused by another tensor), has the same data pointer and,
/// outside inference mode, the same version (an in-place change of the weight makes a new
/// copy). Entries of dead weights are dropped at the next insertion. The copy is written on the
/// stream of the call that made it; a call on another stream first synchronises that stream once
/// (outside graph captures; inside one it makes its own copy, recorded in the graph). Nothing
/// made inside a capture is cached: its contents exist only when the graph replays.
class WeightCache {
 public:
  at::Tensor get(const at::Tensor& w) {
    const auto stream = c10::cuda::getCurrentCUDAStream(w.device().index());
    const bool in_capture = capturing();
    const int64_t version = w.is_inference() ? -1 : static_cast<int64_t>(w._version());
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(w.unsafeGetTensorImpl());
      if (it != entries_.end() && !it->second.source.expired() && it->second.data == w.data_ptr() &&
          it->second.version == version) {
        Entry& e = it->second;
        if (e.shared || e.made_on == stream) return e.khwc;
        if (!in_capture) {
          e.made_on.synchronize();
          e.shared = true;
          return e.khwc;
        }
      }
    }
    at::Tensor khwc = cuda::depthwise_weight_khwc(w);
    if (in_capture) return khwc;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();)
      it = it->second.source.expired() ? entries_.erase(it) : std::next(it);
    entries_.insert_or_assign(
        w.unsafeGetTensorImpl(),
        Entry{Weak(w.getIntrusivePtr()), w.data_ptr(), version, khwc, stream, /*shared=*/false});
    return khwc;
  }

 private:
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct Entry {
    Weak source;
    const void* data;
    int64_t version;  ///< -1 for an inference tensor (no version counter)
    at::Tensor khwc;
    c10::cuda::CUDAStream made_on;
    bool shared;  ///< made_on synchronised after the copy: any stream may read it
  };
  std::mutex mu_;
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
};

WeightCache& weight_cache() {
  static auto* cache = new WeightCache();  // never destroyed: calls may run at static destruction
  return *cache;
}

/// The kernel against ATen once per dtype, on the device of its first call and before it serves
/// a convolution (as `cuda` checks its epilogue): the tiled path for kernel widths 3, 5, 7 at
/// strides 1 and 2, the generic path (2x2, 3x3 dilation 2, 1x1, strides (2, 1)), the 16-byte
/// and the one-element paths, bias and residual, every activation. The reference is the
/// portable path in float64 (no TF32, no 16-bit rounding); the kernel's result must be within
/// one ulp of its dtype (2^-7, 2^-10 relative; float32 1e-5) plus 1e-5 of the sum of the
/// terms' magnitudes (float32 accumulation). A mismatch keeps the implementation declined for
/// the process (its decline reason says so). Not inside a CUDA graph capture (the comparison
/// synchronises): the daemon's capture follows an eager warm-up, which runs the check.
Verified verify_kernel(at::ScalarType dtype, const at::Device& device) {
  static cuda::VerifiedOnce once;
  return once.get(dtype, [&] {
    const at::NoGradGuard no_grad;
    const auto opts = at::TensorOptions().device(device).dtype(dtype);
    const double rel = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
    struct Case {
      int64_t C, kh, kw, stride_h, stride_w, pad, dilation;
      Activation act;
    };
    const Case cases[] = {
        {24, 3, 3, 1, 1, 1, 1, Activation::none}, {24, 3, 3, 2, 2, 1, 1, Activation::relu},
        {16, 5, 5, 1, 1, 2, 1, Activation::silu}, {16, 5, 5, 2, 2, 2, 1, Activation::gelu},
        {8, 7, 7, 1, 1, 3, 1, Activation::tanh},  {8, 7, 7, 2, 2, 3, 1, Activation::silu},
        {20, 5, 5, 1, 1, 2, 1, Activation::silu}, {13, 3, 3, 2, 2, 1, 1, Activation::relu},
        {24, 2, 2, 2, 2, 0, 1, Activation::none}, {24, 3, 3, 1, 1, 2, 2, Activation::gelu},
        {12, 1, 1, 1, 1, 0, 1, Activation::tanh}, {24, 3, 3, 2, 1, 1, 1, Activation::silu},
    };
    bool ok = true;
    int index = 0;
    for (const auto& c : cases) {
      const bool with_residual = index++ % 2 == 0;
      ConvGeometry g;
      g.stride_h = c.stride_h, g.stride_w = c.stride_w;
      g.pad_h = g.pad_w = c.pad;
      g.dilation_h = g.dilation_w = c.dilation;
      g.groups = c.C;
      const int64_t B = 2, H = 11, W = 13;
      const auto x = at::linspace(-3.0, 3.0, B * c.C * H * W, opts)
                         .view({B, H, W, c.C})
                         .flip(2)
                         .permute({0, 3, 1, 2})
                         .contiguous(at::MemoryFormat::ChannelsLast);
      const auto w = at::linspace(-1.0, 1.0, c.C * c.kh * c.kw, opts)
                         .view({c.kh * c.kw, c.C})
                         .t()
                         .reshape({c.C, 1, c.kh, c.kw});
      const auto bias = at::linspace(-0.5, 0.5, c.C, opts);
      const int64_t oh = cuda::conv_output_size(H, c.kh, c.pad, c.stride_h, c.dilation);
      const int64_t ow = cuda::conv_output_size(W, c.kw, c.pad, c.stride_w, c.dilation);
      const auto residual = with_residual ? at::linspace(2.0, -2.0, B * c.C * oh * ow, opts)
                                                .view({B, c.C, oh, ow})
                                                .contiguous(at::MemoryFormat::ChannelsLast)
                                          : at::Tensor();
      const auto y = cuda::depthwise_conv2d_nhwc(x, cuda::depthwise_weight_khwc(w), c.kh, c.kw,
                                                 bias, residual, g, c.act);
      auto d = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
      const auto ref = conv2d_bias_act_portable(d(x), d(w), d(bias), d(residual), g, c.act);
      const auto terms = conv2d_bias_act_portable(d(x).abs(), d(w).abs(), d(bias).abs(),
                                                  with_residual ? d(residual).abs() : at::Tensor(),
                                                  g, Activation::none);
      // float16's subnormal spacing as the floor of one ulp.
      const auto bound = ref.abs() * rel + terms * 1e-5 + (dtype == at::kHalf ? 0x1p-24 : 0.0);
      ok = ok && y.sizes() == ref.sizes() &&
           (y.to(at::kDouble) - ref).abs().le(bound).all().item<bool>();
    }
    return ok;
  });
}

Outcome<at::Tensor> conv2d_bias_act_cuda_depthwise(const at::Tensor& input,
                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                   const at::Tensor& residual,
                                                   const ConvGeometry& g, Activation act) {
  if (!input.is_cuda()) return Decline{"cuda_depthwise: not a CUDA tensor"};
  if (at::GradMode::is_enabled() && (input.requires_grad() || weight.requires_grad() ||
                                     (bias.defined() && bias.requires_grad()) ||
                                     (residual.defined() && residual.requires_grad())))
    return Decline{"cuda_depthwise: autograd (no backward)"};
  if (const char* why = cuda::depthwise_conv2d_decline(input, weight, bias, residual, g))
    return Decline{why};
  switch (verify_kernel(input.scalar_type(), input.device())) {
    case Verified::no:
      return Decline{"cuda_depthwise: kernel failed its check against ATen on this device"};
    case Verified::unknown:
      return Decline{"cuda_depthwise: kernel not checked yet (first call inside a graph capture)"};
    case Verified::yes:
      break;
  }
  return cuda::depthwise_conv2d_nhwc(input, weight_cache().get(weight), weight.size(2),
                                     weight.size(3), bias, residual, g, act);
}

}  // namespace

void register_conv2d_bias_act_cuda_depthwise(Registry& registry) {
  registry.register_impl(
      kConv2dBiasAct, "cuda_depthwise", &conv2d_bias_act_cuda_depthwise,
      [] { return at::cuda::is_available(); }, cuda_models_only);
}

}  // namespace libreyolo::kernels
