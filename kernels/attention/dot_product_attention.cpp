#include "kernels/attention/dot_product_attention.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "kernels/registry.h"

namespace libreyolo::kernels {

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::kManual:
      return "manual";
    case AttentionPath::kSdpa:
      return "sdpa";
    case AttentionPath::kSdpaPaddedMask:
      return "sdpa_padded_mask";
    case AttentionPath::kSdpaWindowBatch:
      return "sdpa_window_batch";
    case AttentionPath::kMemEfficient:
      return "mem_efficient";
  }
  return "unknown";
}

AttentionPath attention_path(c10::DeviceType device, at::ScalarType dtype, BiasKind bias,
                             int64_t tokens, int64_t head_dim) {
  (void)tokens;
  // CPU: SDPA as transformers runs it (the parity fixtures are measured on this path).
  if (device != c10::DeviceType::CUDA) return AttentionPath::kSdpa;
  // CUDA. The fused kernels (flash, memory-efficient, cuDNN) need head_dim % 8 == 0; anything
  // else falls back to SDPA's math backend, slower than the manual math (docs/bench/attention.md).
  if (head_dim % 8 != 0 || head_dim > 128) return AttentionPath::kManual;
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return AttentionPath::kManual;
  // H200, LibTorch 2.11, bench_attention (the speed-ups over manual: docs/bench/attention.md):
  //   no bias (ViT-B 197x64, AIFI 400x32): SDPA picks cuDNN in fp16/bf16 and the
  //   memory-efficient kernel in fp32, both faster than the manual math.
  //   a bias (Swin windows 49x32): SDPA picks cuDNN in fp16/bf16, whose biased kernel is slow
  //   (slower than manual with the expanded mask), while the memory-efficient kernel on the same
  //   aligned mask is the fastest. So biased calls go to the memory-efficient kernel directly,
  //   with the mask stored 16-aligned (no pad per call).
  if (bias == BiasKind::kNone) return AttentionPath::kSdpa;
  return AttentionPath::kMemEfficient;
}

namespace {

/// True when `mask` is in `dtype` with unit last stride and every other stride a multiple of 16
/// elements (ATen attention.cpp aligned_tensor: the memory-efficient kernel reads it in place).
bool is_aligned_mask(const at::Tensor& mask, at::ScalarType dtype) {
  if (mask.scalar_type() != dtype || mask.dim() == 0 || mask.stride(-1) != 1) return false;
  for (int64_t i = 0; i + 1 < mask.dim(); ++i)
    if (mask.stride(i) % 16 != 0) return false;
  return mask.storage_offset() % 16 == 0;
}

/// `mask` (nW or 1, h, Lq, Lk) in `dtype`, stored with rows padded to a multiple of 16
/// elements (zeros) and sliced back to Lk; with batch_windows > 0 the rows are replicated
/// image-major to (batch_windows, h, Lq, Lk) (a contiguous copy of the padded rows, which
/// TensorIterator runs at copy speed; copying into a strided slice is 3-4x slower). Aligned
/// rows let SDPA's memory-efficient kernel read the mask in place (ATen sdp_utils
/// preprocess_mask / pad_bias would pad a copy on every call otherwise).
at::Tensor aligned_mask(const at::Tensor& mask, at::ScalarType dtype, int64_t batch_windows = 0) {
  if (mask.scalar_type() == at::kBool) return mask;  // a boolean mask keeps its meaning
  if (is_aligned_mask(mask, dtype) && (batch_windows == 0 || mask.size(0) == batch_windows))
    return mask;  // prepared already (prepare_window_bias): read in place
  const int64_t n = mask.size(-1), padded = (n + 15) / 16 * 16;
  auto sizes = mask.sizes().vec();
  sizes.back() = padded;
  auto storage = at::zeros(sizes, mask.options().dtype(dtype));
  storage.slice(-1, 0, n).copy_(mask);
  if (batch_windows > 0) {
    auto big = sizes;
    big.insert(big.begin(), batch_windows / mask.size(0));
    auto flat = sizes;
    flat[0] = batch_windows;
    storage = storage.unsqueeze(0).expand(big).reshape(flat);
  }
  return storage.slice(-1, 0, n);
}

/// (nW, h, L, L) window bias -> (B * nW, h, L, L) (image-major), materialised.
at::Tensor expand_window_bias(const at::Tensor& bias, int64_t batch_windows) {
  const int64_t nW = bias.size(0);
  auto sizes = bias.sizes().vec();
  sizes.insert(sizes.begin(), batch_windows / nW);
  auto flat = bias.sizes().vec();
  flat[0] = batch_windows;
  return bias.unsqueeze(0).expand(sizes).reshape(flat);
}

}  // namespace

at::Tensor prepare_attention_bias(const at::Tensor& bias, int64_t batch_windows,
                                  at::ScalarType dtype, AttentionPath path) {
  TORCH_CHECK(bias.dim() == 4 && batch_windows >= 0 &&
                  (batch_windows == 0 || batch_windows % bias.size(0) == 0),
              "attention: cannot prepare bias ", bias.sizes(), " for ", batch_windows, " windows");
  if (path != AttentionPath::kMemEfficient && path != AttentionPath::kSdpaPaddedMask) return bias;
  return aligned_mask(bias, dtype, batch_windows);
}

at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& bias, double scale, AttentionPath path,
                                 bool softmax_in_float32, int64_t bias_windows) {
  const bool windowed = bias.defined() && bias_windows > 0;
  if (windowed) {
    TORCH_CHECK(q.dim() == 4 && q.size(0) % bias_windows == 0, "attention: batch ", q.size(0),
                " is not a multiple of the ", bias_windows, " windows of the bias");
    TORCH_CHECK(bias.dim() == 4 && bias.size(0) == bias_windows, "attention: window bias ",
                bias.sizes(), " does not start with ", bias_windows, " windows");
  }
  TORCH_CHECK(path != AttentionPath::kSdpaWindowBatch || windowed,
              "attention: sdpa_window_batch needs a window bias");
  switch (path) {
    case AttentionPath::kManual:
      break;
    case AttentionPath::kSdpa:
    case AttentionPath::kSdpaPaddedMask: {
      std::optional<at::Tensor> mask;
      if (bias.defined()) {
        if (path == AttentionPath::kSdpaPaddedMask)
          mask = aligned_mask(bias, q.scalar_type(), windowed ? q.size(0) : 0);
        else
          mask = (windowed ? expand_window_bias(bias, q.size(0)) : bias).to(q.scalar_type());
      }
      return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0,
                                              /*is_causal=*/false, scale);
    }
    case AttentionPath::kMemEfficient: {
      TORCH_CHECK(q.is_cuda() && q.dim() == 4, "attention: mem_efficient needs 4-D CUDA tensors");
      std::optional<at::Tensor> mask;
      if (bias.defined()) {
        TORCH_CHECK(bias.scalar_type() != at::kBool,
                    "attention: mem_efficient takes an additive (float) bias");
        auto m = aligned_mask(bias.dim() == 4 ? bias : bias.expand({1, 1, q.size(2), k.size(2)}),
                              q.scalar_type(), windowed ? q.size(0) : 0);
        mask = m.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
      }
      // What SDPA runs for its efficient backend (attention.cpp, sdpa dispatch), called
      // directly: SDPA's own choice for a biased fp16/bf16 call is the slower cuDNN kernel.
      const bool grad = at::GradMode::is_enabled() &&
                        (q.requires_grad() || k.requires_grad() || v.requires_grad());
      return std::get<0>(at::_scaled_dot_product_efficient_attention(
          q, k, v, mask, /*compute_log_sumexp=*/grad, /*dropout_p=*/0.0, /*is_causal=*/false,
          scale));
    }
    case AttentionPath::kSdpaWindowBatch: {
      // (B*nW, H, L, d) -> (B, nW*H, L, d): windows x heads become SDPA's head axis, so the
      // window bias is one (1, nW*H, L, L) tensor broadcast over the B images.
      const int64_t nW = bias_windows, BW = q.size(0), B = BW / nW, H = q.size(1);
      auto batch = [&](const at::Tensor& x) {
        return x.view({B, nW, H, x.size(2), x.size(3)}).reshape({B, nW * H, x.size(2), x.size(3)});
      };
      const auto mask =
          aligned_mask(bias.expand({nW, H, bias.size(2), bias.size(3)}), q.scalar_type())
              .view({1, nW * H, bias.size(2), bias.size(3)});
      auto out = at::scaled_dot_product_attention(batch(q), batch(k), batch(v), mask,
                                                  /*dropout_p=*/0.0, /*is_causal=*/false, scale);
      return out.reshape({BW, H, out.size(2), out.size(3)});
    }
  }
  // transformers eager_attention_forward: matmul, then scale (same order), then + mask.
  auto w = at::matmul(q, k.transpose(2, 3)) * scale;
  if (windowed) {
    // The same additions as w + expand_window_bias(bias), without the (B*nW, H, L, L) copy.
    const auto sizes = w.sizes().vec();
    w = (w.view({-1, bias_windows, w.size(1), w.size(2), w.size(3)}) + bias.unsqueeze(0))
            .view(sizes);
  } else if (bias.defined()) {
    w = w + bias;
  }
  if (softmax_in_float32)
    w = at::softmax(w, -1, at::kFloat).to(q.scalar_type());
  else
    w = at::softmax(w, -1);
  return at::matmul(w, v);
}

namespace {

BiasKind bias_kind(const at::Tensor& bias, int64_t bias_windows) {
  return !bias.defined()    ? BiasKind::kNone
         : bias_windows > 0 ? BiasKind::kWindow
                            : BiasKind::kDense;
}

AttentionPath path_for(const at::Tensor& q, const at::Tensor& bias, int64_t bias_windows) {
  return attention_path(q.device().type(), q.scalar_type(), bias_kind(bias, bias_windows),
                        q.size(2), q.size(3));
}

Outcome<at::Tensor> reference_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& bias, const AttentionCall& c) {
  return dot_product_attention(q, k, v, bias, c.scale, AttentionPath::kManual, c.softmax_in_float32,
                               c.bias_windows);
}

// Every SDPA formulation; the shape class attention_path() gives to mem_efficient runs as SDPA
// on the padded mask here (what runs when the policy excludes mem_efficient).
Outcome<at::Tensor> sdpa_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& bias, const AttentionCall& c) {
  AttentionPath path = path_for(q, bias, c.bias_windows);
  if (path == AttentionPath::kManual) return Decline{"sdpa: the manual math is faster here"};
  if (path == AttentionPath::kMemEfficient) path = AttentionPath::kSdpaPaddedMask;
  return dot_product_attention(q, k, v, bias, c.scale, path, c.softmax_in_float32, c.bias_windows);
}

Outcome<at::Tensor> mem_efficient_impl(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& bias,
                                       const AttentionCall& c) {
  if (!q.is_cuda()) return Decline{"mem_efficient: not a CUDA tensor"};
  if (path_for(q, bias, c.bias_windows) != AttentionPath::kMemEfficient)
    return Decline{"mem_efficient: not this shape class's fastest path"};
  if (bias.defined() && bias.scalar_type() == at::kBool)
    return Decline{"mem_efficient: boolean mask"};
  return dot_product_attention(q, k, v, bias, c.scale, AttentionPath::kMemEfficient,
                               c.softmax_in_float32, c.bias_windows);
}

}  // namespace

/// Declares the slot and registers its three implementations (kernels/builtin.cpp): all are
/// ATen calls, so they exist in every build; mem_efficient binds to CUDA models only.
void register_attention_implementations(Registry& registry) {
  registry.declare(kAttention);
  registry.register_impl(kAttention, kReference, &reference_impl);
  registry.register_impl(kAttention, "sdpa", &sdpa_impl);
  registry.register_impl(kAttention, "mem_efficient", &mem_efficient_impl, {}, cuda_models_only);
}

at::Tensor attention(const AttentionHandle& handle, bool fused, const at::Tensor& q,
                     const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                     const AttentionCall& call) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be (B, H, L, d), got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  if (fused && !handle.empty()) {
    if (auto out = handle(q, k, v, bias, call)) return std::move(*out);
  }
  return dot_product_attention(q, k, v, bias, call.scale, AttentionPath::kManual,
                               call.softmax_in_float32, call.bias_windows);
}

}  // namespace libreyolo::kernels
