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
  const auto q = heads(q_proj->forward(query_in), Lq);
  const auto k = heads(k_proj->forward(key_in), Lk);
  const auto v = heads(v_proj->forward(value_in), Lk);
  auto out = kernels::attention(attention_kernel, fused_attn, q, k, v, bias,
                                {scale, softmax_in_float32, bias_windows});
  out = out.transpose(1, 2).reshape({B, Lq, num_heads * head_dim});
  return o_proj ? o_proj->forward(out) : out;
}

int set_fused_attention(torch::nn::Module& root, bool enabled) {
  int changed = 0;
  auto visit = [&](torch::nn::Module* m) {
    if (auto* a = dynamic_cast<AttentionImpl*>(m)) {
      if (a->fused_attn != enabled) ++changed;
      a->fused_attn = enabled;
    }
  };
  visit(&root);  // modules(include_self) would need root to be owned by a shared_ptr
  for (const auto& m : root.modules(/*include_self=*/false)) visit(m.get());
  return changed;
}

}  // namespace libreyolo::models::layers
