#include "models/layers/bound_kernels.h"

namespace libreyolo::models::layers {

BoundKernels bind_kernels(torch::nn::Module& root, kernels::Registry& registry,
                          const kernels::BindContext& context, const kernels::Filter& filter) {
  BoundKernels k;
  k.ms_deform_attn = registry.bind(kernels::kMsDeformAttn, context, &filter);
  k.sampling_locations = registry.bind(kernels::kSamplingLocations, context, &filter);
  k.refine_boxes = registry.bind(kernels::kRefineBoxes, context, &filter);
  k.rotary_embedding = registry.bind(kernels::kRotaryEmbedding, context, &filter);
  k.attention = registry.bind(kernels::kAttention, context, &filter);
  k.conv2d_bias_act = registry.bind(kernels::kConv2dBiasAct, context, &filter);
  k.max_pool2d = registry.bind(kernels::kMaxPool2d, context, &filter);
  k.add_layer_norm = registry.bind(kernels::kAddLayerNorm, context, &filter);
  k.linear_act = registry.bind(kernels::kLinearAct, context, &filter);
  k.linear = registry.bind(kernels::kLinear, context, &filter);
  auto visit = [&](torch::nn::Module* m) {
    if (auto* user = dynamic_cast<UsesKernels*>(m)) user->bind_kernels(k);
  };
  visit(&root);  // modules(include_self) would need root to be owned by a shared_ptr
  for (const auto& m : root.modules(/*include_self=*/false)) visit(m.get());
  return k;
}

}  // namespace libreyolo::models::layers
