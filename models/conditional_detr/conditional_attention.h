// The decoder attentions of Conditional DETR (transformers 5.17 modular_conditional_detr.py
// ConditionalDetrDecoderSelfAttention / ConditionalDetrDecoderCrossAttention) and of DAB-DETR,
// which derives from it (modeling_dab_detr.py DabDetrDecoderLayerSelfAttention /
// DabDetrDecoderLayerCrossAttention): content and position projections summed, and in the
// cross-attention the query's sine embedding and the keys' spatial embedding concatenated per
// head ("conditional spatial query"), doubling the query/key head width. Both families store the
// same projections under different names, so the names are parameters; the math is one.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>

#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::conditional_detr {

/// On-disk names of one decoder attention's projections, relative to the module that owns them
/// (Conditional DETR: the decoder layer, "sa_qcontent_proj" ...; DAB-DETR: the layer's
/// self_attn / cross_attn module, "self_attn_query_content_proj" ...), and of the attention
/// module holding the output projection.
struct AttentionNames {
  std::string q_content, q_pos, k_content, k_pos, v;
  std::string q_pos_sine;  ///< cross-attention only
  std::string attention, out;
};

/// Conditional DETR's names ("sa_" / "ca_" prefixes, self_attn / encoder_attn .out_proj).
AttentionNames conditional_self_attention_names();
AttentionNames conditional_cross_attention_names();

/// Self-attention among the queries: q = q_content(x) + q_pos(query_pos), k = k_content(x) +
/// k_pos(query_pos), v = v(x), heads of d / num_heads, then out_proj. Registers its modules into
/// `owner`.
class DecoderSelfAttention {
 public:
  DecoderSelfAttention() = default;
  DecoderSelfAttention(torch::nn::Module& owner, int64_t d, int64_t heads,
                       const AttentionNames& names);
  /// x, query_pos (B, Q, D) -> (B, Q, D), the attention output before the residual.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos) const;
  layers::Linear q_content, q_pos, k_content, k_pos, v;
  layers::ProjectedAttention attention;
};

/// Cross-attention from the queries to the encoder memory. k_pos = k_pos(memory_pos); where
/// query_pos is given (the first layer, or DAB-DETR keep_query_pos) q = q_content(x) +
/// q_pos(query_pos) and k = k_content(memory) + k_pos, else the content alone; then per head
/// [q | q_pos_sine(query_sine)] and [k | k_pos] (width 2 * d / num_heads, scale its ^-0.5),
/// v = v(memory), out_proj.
class DecoderCrossAttention {
 public:
  DecoderCrossAttention() = default;
  /// has_q_pos: whether this layer stores the q_pos projection (upstream sets it to None on
  /// every layer but the first unless keep_query_pos).
  DecoderCrossAttention(torch::nn::Module& owner, int64_t d, int64_t heads,
                        const AttentionNames& names, bool has_q_pos);
  /// x (B, Q, D), memory and memory_pos (B, S, D), query_sine (B, Q, D), query_pos (B, Q, D) or
  /// undefined (ignored unless has_q_pos), bias (B, 1, 1, S) additive key padding mask.
  /// Returns (B, Q, D), the attention output before the residual.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& memory, const at::Tensor& memory_pos,
                     const at::Tensor& query_sine, const at::Tensor& query_pos,
                     const at::Tensor& bias) const;
  layers::Linear q_content, q_pos, k_content, k_pos, v, q_pos_sine;
  layers::ProjectedAttention attention;
  int64_t heads = 1;
};

}  // namespace libreyolo::models::conditional_detr
