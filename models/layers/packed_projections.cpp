#include "models/layers/packed_projections.h"

#include <memory>

namespace libreyolo::models::layers {

void pack_projections(AttentionImpl& a, const std::string& linear_name) {
  const auto& q = a.q_proj->weight;
  const int64_t D = q.size(0), in = q.size(1);
  const bool biased = a.q_proj->bias.defined();
  for (const auto& projection : {a.q_proj, a.k_proj, a.v_proj})
    for (const auto& child : a.named_children())
      if (child.value().get() == projection.get()) {
        a.unregister_module(child.key());
        break;
      }
  if (linear_name.empty()) {
    a.in_proj_weight = a.register_parameter("in_proj_weight", at::empty({3 * D, in}));
    if (biased) a.in_proj_bias = a.register_parameter("in_proj_bias", at::empty({3 * D}));
    return;
  }
  // load_state_dict fills the Linear's tensors in place (set_data): these handles see the values.
  const auto qkv = a.register_module(linear_name, std::make_shared<LinearImpl>(in, 3 * D, biased));
  a.in_proj_weight = qkv->weight;
  a.in_proj_bias = qkv->bias;
}

void bind_packed_projections(AttentionImpl& a) {
  // The projections are out of the module tree: their weights become row views of the loaded
  // (converted) packed tensors.
  const int64_t D = a.in_proj_weight.size(0) / 3;
  Linear projections[] = {a.q_proj, a.k_proj, a.v_proj};
  for (int64_t i = 0; i < 3; ++i) {
    projections[i]->weight = a.in_proj_weight.narrow(0, i * D, D);
    if (a.in_proj_bias.defined()) projections[i]->bias = a.in_proj_bias.narrow(0, i * D, D);
  }
  a.concat_projections = 3;
}

}  // namespace libreyolo::models::layers
