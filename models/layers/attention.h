// The one plain (dense) multi-head attention of every family (RT-DETR/v2 and D-FINE AIFI +
// decoder self-attention, Deformable DETR decoder self-attention, ViT, Swin windows).
//
// Manual math, transformers `eager_attention_forward`:
//   w = softmax(q k^T * scale + bias, -1) ; out = w v
// With `fused_attn` the same call goes to at::scaled_dot_product_attention (SDPA), which is
// what transformers 5.17 runs by default; it differs from the manual math at the 1e-7..1e-6
// level (hf-models.md 1.4). DESIGN.md "Fused attention": off by default, flipped per model by
// set_fused_attention(); never used by anything that traces or exports.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>

#include "models/layers/layers.h"

namespace libreyolo::models::layers {

/// The formulations of one attention call. All compute softmax(q k^T * scale + bias) v; they
/// differ in kernels and memory traffic (docs/bench/attention.md measures them).
enum class AttentionPath {
  kManual,           ///< matmul, * scale, + bias, softmax, matmul (transformers eager)
  kSdpa,             ///< at::scaled_dot_product_attention, bias expanded to (B, H, Lq, Lk)
  kSdpaPaddedMask,   ///< SDPA, the bias copied once into storage whose rows are padded to a
                     ///< multiple of 8 elements (SDPA's memory-efficient kernel would pad it
                     ///< again otherwise: sdp_utils preprocess_mask)
  kSdpaWindowBatch,  ///< window bias only: q/k/v laid out (B, nW*H, L, d) so that the bias is
                     ///< one (1, nW*H, L, L) tensor broadcast over the images (no per-image copy)
  kMemEfficient,     ///< CUDA only: SDPA's memory-efficient (cutlass) kernel called directly
                     ///< (at::_scaled_dot_product_efficient_attention) on the 16-aligned mask;
                     ///< SDPA itself would pick cuDNN for a biased fp16/bf16 call (slower)
};

/// What the bias of a call is: none, a dense tensor broadcastable to (B, H, Lq, Lk), or a
/// per-window bias (nW, H or 1, L, L) shared by every image (Swin: relative position bias plus
/// the shifted-window mask; batch index i uses window i % nW).
enum class BiasKind { kNone, kDense, kWindow };

/// "manual", "sdpa", "sdpa_padded_mask", "sdpa_window_batch", "mem_efficient".
const char* attention_path_name(AttentionPath path);

/// The formulation `fused_attn = true` runs for a shape class: the fastest one measured within
/// tolerance (1e-4 in float32) of the manual math on the device kind. The table and the numbers
/// behind it: docs/bench/attention.md (tools/bench_attention). Deterministic, no device query.
AttentionPath attention_path(c10::DeviceType device, at::ScalarType dtype, BiasKind bias,
                             int64_t tokens, int64_t head_dim);

/// The bias that `path` reads in place, so that a caller can build it once and reuse it (Swin
/// caches it per block): for kMemEfficient and kSdpaPaddedMask, `bias` (nW or 1, H or 1, Lq, Lk)
/// in `dtype` stored with rows padded to 16 elements and, when batch_windows > 0, replicated
/// image-major to (batch_windows, ...); pass it with bias_windows = batch_windows (or a leading
/// slice of it for fewer images). Other paths: `bias` unchanged (they read it without a
/// per-call copy). Bytes: batch_windows * H * Lq * 16-padded Lk * sizeof(dtype). Throws
/// c10::Error when bias is not 4-D or batch_windows is not a multiple of its windows.
at::Tensor prepare_attention_bias(const at::Tensor& bias, int64_t batch_windows,
                                  at::ScalarType dtype, AttentionPath path);

/// q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv); bias additive, broadcastable to
/// (B, H, Lq, Lk), or undefined. Returns (B, H, Lq, dv) in q's dtype.
/// softmax_in_float32: softmax computed in float32 then cast back (ViT/Swin eager path).
/// bias_windows > 0: bias is a window bias (nW = bias_windows, shape (nW, H or 1, Lq, Lk)) and
/// B is a multiple of nW (image-major windows); the manual math then adds it without
/// materialising the (B, H, Lq, Lk) copy (byte-identical to adding the expanded bias).
/// fused: run attention_path(...) for this call; otherwise kManual. Throws c10::Error on shapes
/// that do not match.
at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& bias, double scale, bool fused,
                                 bool softmax_in_float32 = false, int64_t bias_windows = 0);

/// Same, with the formulation chosen by the caller (benchmarks, tests). kSdpaWindowBatch needs
/// bias_windows > 0, kMemEfficient CUDA tensors and a float bias (c10::Error otherwise).
at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& bias, double scale, AttentionPath path,
                                 bool softmax_in_float32 = false, int64_t bias_windows = 0);

/// Construction options. Child names are the on-disk ones: RT-DETR/Deformable DETR
/// q_proj/k_proj/v_proj/out_proj (the default); ViT "attention.attention" and Swin
/// "attention.self" use query/key/value with o_name "" (their output projection lives in a
/// sibling module: call forward(), then apply it yourself).
struct AttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  bool bias = true;  ///< q/k/v/o Linear biases (ViT qkv_bias)
  std::string q_name = "q_proj", k_name = "k_proj", v_name = "v_proj", o_name = "out_proj";
  std::optional<double> scale;  ///< default head_dim^-0.5
  bool softmax_in_float32 = false;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& o);

  /// query_in (B, Lq, D), key_in (B, Lk, D), value_in (B, Lk, D) (the DETR layers pass
  /// q = k = x + pos, v = x); bias additive, broadcastable to (B, H, Lq, Lk), or undefined.
  /// Returns (B, Lq, D): heads concatenated (index h * head_dim + c), then the output
  /// projection when there is one.
  /// bias_windows > 0: bias is a window bias (bias_windows, H or 1, Lq, Lk) shared by the
  /// images (see dot_product_attention).
  at::Tensor forward(const at::Tensor& query_in, const at::Tensor& key_in,
                     const at::Tensor& value_in, const at::Tensor& bias = at::Tensor(),
                     int64_t bias_windows = 0) const;

  /// Selects the fused formulation attention_path() picks for the call's shape class instead of
  /// the manual math. Not thread-safe to flip while forward() runs (set it at load time).
  bool fused_attn = false;

  /// Set by the qkv_concat layout (models/layouts/): 3 = q, k and v projections concatenated
  /// into in_proj_weight (3D, D) / in_proj_bias (3D), 2 = q and k only (2D rows; v keeps its
  /// own), 0 = separate projections. q_proj/k_proj(/v_proj) weights then are views into it.
  /// forward() runs one GEMM for the inputs that are the same tensor (query_in.is_same(key_in),
  /// ...) and the views otherwise, so any call stays correct.
  int64_t concat_projections = 0;
  at::Tensor in_proj_weight, in_proj_bias;  ///< undefined unless concat_projections > 0

  Linear q_proj, k_proj, v_proj, o_proj;  ///< o_proj null when o_name is ""
  int64_t num_heads, head_dim;
  double scale;
  bool softmax_in_float32;
};
using Attention = std::shared_ptr<AttentionImpl>;

/// Sets `fused_attn` on every AttentionImpl in `root`'s tree (root included); returns how many
/// changed value.
int set_fused_attention(torch::nn::Module& root, bool enabled);

}  // namespace libreyolo::models::layers
