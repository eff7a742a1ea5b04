#include "models/deformable_detr/resnet.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace libreyolo::models::deformable_detr {
namespace {

layers::ConvNorm conv_norm(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                           layers::Activation act) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.padding = kernel / 2;  // transformers ResNetConvLayer
  o.act = act;
  o.frozen = true;  // Deformable DETR replaces every backbone BatchNorm2d
  o.conv_name = "convolution";
  o.norm_name = "normalization";
  return std::make_shared<layers::ConvNormImpl>(o);
}

}  // namespace

ResNetConfig parse_resnet_config(const core::ConfigView& v,
                                 const std::vector<int64_t>& default_out_indices) {
  ResNetConfig c;
  c.num_channels = v.get_int("num_channels", 3);
  c.embedding_size = v.get_int("embedding_size", 64);
  c.hidden_sizes = v.get_int_list("hidden_sizes", c.hidden_sizes);
  c.depths = v.get_int_list("depths", c.depths);
  c.layer_type = v.get_enum("layer_type", "bottleneck", {"bottleneck", "basic"});
  try {
    c.act = layers::activation_from_name(v.get_string("hidden_act", "relu"));
  } catch (const std::invalid_argument& e) {
    v.fail("hidden_act", e.what());
  }
  c.downsample_in_first_stage = v.get_bool("downsample_in_first_stage", false);
  c.downsample_in_bottleneck = v.get_bool("downsample_in_bottleneck", false);
  if (c.hidden_sizes.empty() || c.hidden_sizes.size() != c.depths.size())
    v.fail("depths", "must have one entry per entry of 'hidden_sizes'");
  for (auto d : c.depths)
    if (d < 1) v.fail("depths", "every stage needs at least one layer");
  const int64_t num_stages = static_cast<int64_t>(c.depths.size());
  if (v.has("out_indices")) {
    c.out_indices = v.get_int_list("out_indices");
  } else if (v.has("out_features")) {
    c.out_indices.clear();
    const auto& f = v.raw("out_features");
    if (!f.is_array()) v.fail("out_features", "expected a list of stage names");
    for (const auto& name : f) {
      const std::string s = name.is_string() ? name.get<std::string>() : "";
      if (s == "stem") {
        c.out_indices.push_back(0);
      } else if (s.rfind("stage", 0) == 0) {
        try {
          c.out_indices.push_back(std::stoll(s.substr(5)));
        } catch (const std::exception&) {
          v.fail("out_features", "unknown stage name " + name.dump());
        }
      } else {
        v.fail("out_features", "unknown stage name " + name.dump());
      }
    }
  } else {
    c.out_indices = default_out_indices;
  }
  if (c.out_indices.empty()) v.fail("out_indices", "is empty");
  for (auto i : c.out_indices)
    if (i < 0 || i > num_stages)
      v.fail("out_indices", c10::str("index ", i, " outside [0, ", num_stages, "]"));
  return c;
}

ResNetLayerImpl::ResNetLayerImpl(const ResNetConfig& c, int64_t in, int64_t out, int64_t stride)
    : act(c.act) {
  using layers::Activation;
  if (in != out || stride != 1)
    shortcut = register_module("shortcut", conv_norm(in, out, 1, stride, Activation::none));
  if (c.layer_type == "bottleneck") {
    const int64_t reduced = out / 4;  // ResNetBottleNeckLayer reduction = 4
    const bool first = c.downsample_in_bottleneck;
    layer = {conv_norm(in, reduced, 1, first ? stride : 1, c.act),
             conv_norm(reduced, reduced, 3, first ? 1 : stride, c.act),
             conv_norm(reduced, out, 1, 1, Activation::none)};
  } else {
    layer = {conv_norm(in, out, 3, stride, c.act), conv_norm(out, out, 3, 1, Activation::none)};
  }
  layers::register_list(*this, "layer", layer);
}

at::Tensor ResNetLayerImpl::forward(const at::Tensor& x) const {
  at::Tensor h = x;
  if (layer.back()->folded) {
    // batchnorm_fold layout: residual add + activation inside the last convolution's
    // conv2d_bias_act call (same order: conv + bias, + residual, act).
    for (size_t i = 0; i + 1 < layer.size(); ++i) h = layer[i]->forward(h);
    return layer.back()->forward_residual(h, shortcut ? shortcut->forward(x) : x, act);
  }
  for (const auto& l : layer) h = l->forward(h);
  h = h + (shortcut ? shortcut->forward(x) : x);
  return layers::activate(act, h);
}

ResNetBackboneImpl::ResNetBackboneImpl(const ResNetConfig& c) : config(c) {
  auto embedder = register_module("embedder", std::make_shared<torch::nn::Module>());
  stem = embedder->register_module("embedder",
                                   conv_norm(c.num_channels, c.embedding_size, 7, 2, c.act));
  pooler = embedder->register_module(
      "pooler", std::make_shared<layers::MaxPool2dImpl>(layers::square_pool(3, 2, 1)));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto stages_module = encoder->register_module("stages", std::make_shared<torch::nn::Module>());
  int64_t in = c.embedding_size;
  for (size_t s = 0; s < c.depths.size(); ++s) {
    const int64_t out = c.hidden_sizes[s];
    const int64_t stride = s == 0 ? (c.downsample_in_first_stage ? 2 : 1) : 2;
    std::vector<std::shared_ptr<ResNetLayerImpl>> ls;
    ls.push_back(std::make_shared<ResNetLayerImpl>(c, in, out, stride));
    for (int64_t l = 1; l < c.depths[s]; ++l)
      ls.push_back(std::make_shared<ResNetLayerImpl>(c, out, out, 1));
    auto stage =
        stages_module->register_module(std::to_string(s), std::make_shared<torch::nn::Module>());
    stages.push_back(layers::register_list(*stage, "layers", ls));
    in = out;
  }
}

std::vector<at::Tensor> ResNetBackboneImpl::forward(const at::Tensor& pixel_values) const {
  // hidden_states = (stem output, stage1 output, ...); out_indices select from it.
  std::vector<at::Tensor> hidden;
  auto h = pooler->forward(stem->forward(pixel_values));
  hidden.push_back(h);
  for (const auto& stage : stages) {
    for (const auto& l : stage) h = l->forward(h);
    hidden.push_back(h);
  }
  std::vector<at::Tensor> out;
  for (auto i : config.out_indices) out.push_back(hidden[static_cast<size_t>(i)]);
  return out;
}

std::vector<int64_t> ResNetBackboneImpl::channels() const {
  std::vector<int64_t> ch;
  for (auto i : config.out_indices)
    ch.push_back(i == 0 ? config.embedding_size : config.hidden_sizes[static_cast<size_t>(i - 1)]);
  return ch;
}

}  // namespace libreyolo::models::deformable_detr
