// Conditional DETR / DAB-DETR decoder attentions (see conditional_attention.h), in transformers'
// operation order.
#include "models/conditional_detr/conditional_attention.h"

#include <memory>

namespace libreyolo::models::conditional_detr {
namespace {

layers::Linear linear(torch::nn::Module& owner, const std::string& name, int64_t d) {
  return owner.register_module(name, std::make_shared<layers::LinearImpl>(d, d));
}

}  // namespace

AttentionNames conditional_self_attention_names() {
  return {"sa_qcontent_proj", "sa_qpos_proj", "sa_kcontent_proj", "sa_kpos_proj", "sa_v_proj", "",
          "self_attn",        "out_proj"};
}

AttentionNames conditional_cross_attention_names() {
  return {"ca_qcontent_proj", "ca_qpos_proj",      "ca_kcontent_proj", "ca_kpos_proj",
          "ca_v_proj",        "ca_qpos_sine_proj", "encoder_attn",     "out_proj"};
}

DecoderSelfAttention::DecoderSelfAttention(torch::nn::Module& owner, int64_t d, int64_t heads,
                                           const AttentionNames& n) {
  q_content = linear(owner, n.q_content, d);
  q_pos = linear(owner, n.q_pos, d);
  k_content = linear(owner, n.k_content, d);
  k_pos = linear(owner, n.k_pos, d);
  v = linear(owner, n.v, d);
  attention = owner.register_module(
      n.attention, std::make_shared<layers::ProjectedAttentionImpl>(d, d, heads, n.out));
}

at::Tensor DecoderSelfAttention::forward(const at::Tensor& x, const at::Tensor& query_pos) const {
  const auto q = q_content->forward(x) + q_pos->forward(query_pos);
  const auto k = k_content->forward(x) + k_pos->forward(query_pos);
  return attention->forward(q, k, v->forward(x));
}

DecoderCrossAttention::DecoderCrossAttention(torch::nn::Module& owner, int64_t d, int64_t heads_,
                                             const AttentionNames& n, bool has_q_pos)
    : heads(heads_) {
  q_content = linear(owner, n.q_content, d);
  if (has_q_pos) q_pos = linear(owner, n.q_pos, d);
  k_content = linear(owner, n.k_content, d);
  k_pos = linear(owner, n.k_pos, d);
  v = linear(owner, n.v, d);
  q_pos_sine = linear(owner, n.q_pos_sine, d);
  attention = owner.register_module(
      n.attention, std::make_shared<layers::ProjectedAttentionImpl>(d, 2 * d, heads, n.out));
}

at::Tensor DecoderCrossAttention::forward(const at::Tensor& x, const at::Tensor& memory,
                                          const at::Tensor& memory_pos,
                                          const at::Tensor& query_sine, const at::Tensor& query_pos,
                                          const at::Tensor& bias) const {
  const int64_t B = x.size(0), Q = x.size(1), S = memory.size(1), D = x.size(2);
  auto q = q_content->forward(x);
  auto k = k_content->forward(memory);
  const auto value = v->forward(memory);
  const auto key_pos = k_pos->forward(memory_pos);
  if (q_pos && query_pos.defined()) {
    q = q + q_pos->forward(query_pos);
    k = k + key_pos;
  }
  const int64_t hd = D / heads;
  const auto sine = q_pos_sine->forward(query_sine).view({B, Q, heads, hd});
  const auto query = at::cat({q.view({B, Q, heads, hd}), sine}, -1).view({B, Q, 2 * D});
  const auto key =
      at::cat({k.view({B, S, heads, hd}), key_pos.view({B, S, heads, hd})}, -1).view({B, S, 2 * D});
  return attention->forward(query, key, value, bias);
}

}  // namespace libreyolo::models::conditional_detr
