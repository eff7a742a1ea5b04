#include "models/layers/attention.h"

#include <cmath>

namespace libreyolo::models::layers {

AttentionImpl::AttentionImpl(const AttentionOptions& o)
    : num_heads(o.num_heads),
      head_dim(o.embed_dim / o.num_heads),
      softmax_in_float32(o.softmax_in_float32) {
  TORCH_CHECK(o.num_heads > 0 && o.embed_dim % o.num_heads == 0, "attention: embed_dim ",
              o.embed_dim, " is not divisible by num_heads ", o.num_heads);
  scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  q_proj =
      register_module(o.q_name, std::make_shared<LinearImpl>(o.embed_dim, o.embed_dim, o.bias));
  k_proj =
      register_module(o.k_name, std::make_shared<LinearImpl>(o.embed_dim, o.embed_dim, o.bias));
  v_proj =
      register_module(o.v_name, std::make_shared<LinearImpl>(o.embed_dim, o.embed_dim, o.bias));
  if (!o.o_name.empty())
    o_proj =
        register_module(o.o_name, std::make_shared<LinearImpl>(o.embed_dim, o.embed_dim, o.bias));
}

at::Tensor AttentionImpl::forward(const at::Tensor& query_in, const at::Tensor& key_in,
                                  const at::Tensor& value_in, const at::Tensor& bias,
                                  int64_t bias_windows) const {
  const int64_t B = query_in.size(0), Lq = query_in.size(1), Lk = key_in.size(1);
  auto heads = [&](const at::Tensor& x, int64_t L) {
    return x.view({B, L, num_heads, head_dim}).transpose(1, 2);
  };
  at::Tensor q, k, v;
  const bool qk_shared = concat_projections >= 2 && query_in.is_same(key_in);
  if (qk_shared) {
    // One GEMM over the concatenated rows; (B, L, n, H, d) then per-projection (B, H, L, d).
    const bool qkv_shared = concat_projections == 3 && key_in.is_same(value_in);
    const int64_t n = qkv_shared ? 3 : 2, D = num_heads * head_dim;
    const auto w = n == 3 ? in_proj_weight : in_proj_weight.narrow(0, 0, 2 * D);
    const auto b = !in_proj_bias.defined() ? at::Tensor()
                   : n == 3                ? in_proj_bias
                                           : in_proj_bias.narrow(0, 0, 2 * D);
    // The q/k-only weight is a view made per call: at::linear, not the `linear` slot, whose
    // packed copies are kept per weight tensor (kernels/cpu/packed_weights.h).
    const auto projected =
        in_proj_fp8.defined()
            ? kernels::fp8_linear(in_proj_fp8_kernel, query_in, in_proj_fp8.rows(0, n * D), w, b)
        : n == 3 ? kernels::linear(linear_kernel, query_in, w, b)
                 : at::linear(query_in, w, b);
    const auto packed = projected.view({B, Lq, n, num_heads, head_dim});
    q = packed.select(2, 0).transpose(1, 2);
    k = packed.select(2, 1).transpose(1, 2);
    v = qkv_shared ? packed.select(2, 2).transpose(1, 2) : heads(v_proj->forward(value_in), Lk);
  } else {
    q = heads(q_proj->forward(query_in), Lq);
    k = heads(k_proj->forward(key_in), Lk);
    v = heads(v_proj->forward(value_in), Lk);
  }
  auto out = kernels::attention(attention_kernel, fused_attn, q, k, v, bias,
                                {scale, softmax_in_float32, bias_windows});
  out = out.transpose(1, 2).reshape({B, Lq, num_heads * head_dim});
  return o_proj ? o_proj->forward(out) : out;
}

ProjectedAttentionImpl::ProjectedAttentionImpl(int64_t embed_dim_, int64_t qk_dim_,
                                               int64_t num_heads_, const std::string& o_name,
                                               std::optional<double> scale_)
    : num_heads(num_heads_), embed_dim(embed_dim_), qk_dim(qk_dim_) {
  TORCH_CHECK(num_heads > 0 && embed_dim % num_heads == 0 && qk_dim % num_heads == 0,
              "attention: embed_dim ", embed_dim, " and qk_dim ", qk_dim,
              " are not both divisible by num_heads ", num_heads);
  scale = scale_ ? *scale_ : 1.0 / std::sqrt(static_cast<double>(qk_dim / num_heads));
  o_proj = register_module(o_name, std::make_shared<LinearImpl>(embed_dim, embed_dim, true));
}

at::Tensor ProjectedAttentionImpl::forward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& bias) const {
  const int64_t B = q.size(0), Lq = q.size(1), Lk = k.size(1);
  auto heads = [&](const at::Tensor& x, int64_t L, int64_t width) {
    return x.view({B, L, num_heads, width / num_heads}).transpose(1, 2);
  };
  auto out = kernels::attention(attention_kernel, fused_attn, heads(q, Lq, qk_dim),
                                heads(k, Lk, qk_dim), heads(v, Lk, embed_dim), bias, {scale});
  return o_proj->forward(out.transpose(1, 2).reshape({B, Lq, embed_dim}));
}

int set_fused_attention(torch::nn::Module& root, bool enabled) {
  int changed = 0;
  auto visit = [&](torch::nn::Module* m) {
    if (auto* a = dynamic_cast<AttentionImpl*>(m)) {
      if (a->fused_attn != enabled) ++changed;
      a->fused_attn = enabled;
    } else if (auto* p = dynamic_cast<ProjectedAttentionImpl*>(m)) {
      if (p->fused_attn != enabled) ++changed;
      p->fused_attn = enabled;
    }
  };
  visit(&root);  // modules(include_self) would need root to be owned by a shared_ptr
  for (const auto& m : root.modules(/*include_self=*/false)) visit(m.get());
  return changed;
}

bool fused_attention_by_default(const at::Device& device, at::ScalarType dtype) {
  return (device.is_cuda() || device.is_cpu()) && (dtype == at::kHalf || dtype == at::kBFloat16);
}

}  // namespace libreyolo::models::layers
