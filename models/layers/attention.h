// The one plain (dense) multi-head attention of every family (RT-DETR/v2 and D-FINE AIFI +
// decoder self-attention, Deformable DETR decoder self-attention, ViT, Swin windows).
//
// Manual math, transformers `eager_attention_forward`:
//   w = softmax(q k^T * scale + bias, -1) ; out = w v
// With `fused_attn` the call goes through the model's bound `attention` slot (SDPA, the
// memory-efficient kernel: kernels/attention/dot_product_attention.h), which is what
// transformers 5.17 runs by default; it differs from the manual math at the 1e-7..1e-6 level.
// docs/DESIGN.md "Fused attention": off by default, flipped per model by set_fused_attention();
// never used by anything that traces or exports.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>

#include "kernels/attention/dot_product_attention.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/layers.h"

namespace libreyolo::models::layers {

// The attention math is the `attention` slot's (kernels/attention/dot_product_attention.h);
// these names are the families' view of it.
using kernels::attention_path;
using kernels::attention_path_name;
using kernels::AttentionPath;
using kernels::BiasKind;
using kernels::dot_product_attention;
using kernels::prepare_attention_bias;

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

class AttentionImpl : public torch::nn::Module, public UsesKernels {
 public:
  explicit AttentionImpl(const AttentionOptions& o);
  void bind_kernels(const BoundKernels& k) override {
    attention_kernel = k.attention;
    linear_kernel = k.linear;
  }

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
  /// The `attention` slot as bound for the model (empty until bound: the manual math runs).
  kernels::AttentionHandle attention_kernel;
  kernels::LinearHandle linear_kernel;  ///< the packed q/k/v GEMM (concat_projections 3)

  /// Set by the qkv_concat layout (models/layouts/): 3 = q, k and v projections concatenated
  /// into in_proj_weight (3D, D) / in_proj_bias (3D), 2 = q and k only (2D rows; v keeps its
  /// own), 0 = separate projections. q_proj/k_proj(/v_proj) weights then are views into it.
  /// forward() runs one GEMM for the inputs that are the same tensor (query_in.is_same(key_in),
  /// ...) and the views otherwise, so any call stays correct.
  int64_t concat_projections = 0;
  at::Tensor in_proj_weight, in_proj_bias;  ///< undefined unless concat_projections > 0
  /// in_proj_weight in FP8 and its `fp8_gemm` handle (models/quantization/fp8.h); undefined
  /// unless the model was loaded with `quantization: fp8` on a capable device.
  kernels::Fp8Weight in_proj_fp8;
  kernels::Fp8GemmHandle in_proj_fp8_kernel;

  Linear q_proj, k_proj, v_proj, o_proj;  ///< o_proj null when o_name is ""
  int64_t num_heads, head_dim;
  double scale;
  bool softmax_in_float32;
};
using Attention = std::shared_ptr<AttentionImpl>;

/// Attention over queries, keys and values its caller has already projected: the head split,
/// the `attention` slot and the output projection (`o_name`, on-disk "out_proj"). For the
/// Conditional DETR and DAB-DETR decoder attentions (transformers 5.17
/// ConditionalDetrDecoderSelfAttention / ConditionalDetrDecoderCrossAttention,
/// DabDetrAttention), whose queries and keys are sums or per-head concatenations of several
/// projections that live outside the attention module on disk.
class ProjectedAttentionImpl : public torch::nn::Module, public UsesKernels {
 public:
  /// embed_dim: the values' and the output's width; qk_dim: the queries' and keys' (2 *
  /// embed_dim for the concatenated cross-attentions). scale defaults to (qk_dim /
  /// num_heads)^-0.5.
  ProjectedAttentionImpl(int64_t embed_dim, int64_t qk_dim, int64_t num_heads,
                         const std::string& o_name = "out_proj",
                         std::optional<double> scale = std::nullopt);
  void bind_kernels(const BoundKernels& k) override { attention_kernel = k.attention; }

  /// q (B, Lq, qk_dim), k (B, Lk, qk_dim), v (B, Lk, embed_dim), each head's channels
  /// contiguous (index h * head_dim + c); bias additive, broadcastable to (B, H, Lq, Lk), or
  /// undefined. Returns o_proj(heads concatenated), (B, Lq, embed_dim).
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& bias = at::Tensor()) const;

  bool fused_attn = false;  ///< as AttentionImpl::fused_attn
  kernels::AttentionHandle attention_kernel;
  Linear o_proj;
  int64_t num_heads, embed_dim, qk_dim;
  double scale;
};
using ProjectedAttention = std::shared_ptr<ProjectedAttentionImpl>;

/// Sets `fused_attn` on every AttentionImpl and ProjectedAttentionImpl in `root`'s tree (root
/// included); returns how many changed value.
int set_fused_attention(torch::nn::Module& root, bool enabled);

/// The device rule for a model whose configuration leaves fused attention at `default`: true
/// for CUDA and CPU models in float16 / bfloat16, whose manual math is no more exact than 16-bit
/// rounding anyway: on CUDA the fused kernels (SDPA flash / cuDNN / memory-efficient) are much
/// faster on the ViT-backbone families (docs/BENCHMARKS.md, "Attention, manual vs SDPA"), on the
/// CPU SDPA's flash kernel made RT-DETR-R18 / R50 and D-FINE L 2-12% faster in bfloat16
/// (docs/BENCHMARKS.md, "Fused attention on the CPU in bfloat16"); false for float32 models,
/// which keep the family's default (the byte-exact parity bar with transformers is a float32
/// rule). docs/DESIGN.md "Fused attention".
bool fused_attention_by_default(const at::Device& device, at::ScalarType dtype);

}  // namespace libreyolo::models::layers
