#include "models/detr/timm_resnet.h"

#include <c10/util/StringUtil.h>

#include <map>
#include <utility>

#include "models/core/safetensors_header.h"
#include "models/core/state_dict.h"

namespace libreyolo::models::detr {
namespace {

layers::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation = 1) {
  layers::Conv2dOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.dilation = dilation;
  o.padding = dilation * (kernel / 2);  // timm: padding = kernel // 2, or the 3x3's dilation
  o.bias = false;
  return std::make_shared<layers::Conv2dImpl>(o);
}

layers::FrozenBatchNorm2d norm(int64_t channels) {
  return std::make_shared<layers::FrozenBatchNorm2dImpl>(channels);
}

}  // namespace

TimmResNetConfig read_timm_resnet_config(const core::SafetensorsFile& file,
                                         const std::string& prefix, int64_t num_channels,
                                         int64_t last_stage, const std::string& name) {
  auto require = [&](const std::string& key) -> const std::vector<int64_t>& {
    if (!file.contains(key))
      throw core::CheckpointError(
          file.path() + ": checkpoint does not match the model: missing keys (1): " + key);
    return file.info(key).shape;
  };
  TimmResNetConfig c;
  c.num_channels = num_channels;
  c.stem_width = require(prefix + "conv1.weight").at(0);
  require(prefix + "layer1.0.conv1.weight");
  c.bottleneck = file.contains(prefix + "layer1.0.conv3.weight");
  for (int64_t s = 1; s <= last_stage; ++s) {
    const std::string stage = prefix + "layer" + std::to_string(s) + ".";
    int64_t depth = 0;
    while (file.contains(stage + std::to_string(depth) + ".conv1.weight")) ++depth;
    if (depth == 0) require(stage + "0.conv1.weight");
    c.depths.push_back(depth);
    c.widths.push_back(require(stage + "0.conv1.weight").at(0));
    c.outs.push_back(require(stage + "0." + (c.bottleneck ? "conv3" : "conv2") + ".weight").at(0));
  }
  // timm's registered plain ResNets (timm/models/resnet.py): block type and depths.
  static const std::map<std::string, std::pair<bool, std::vector<int64_t>>> known{
      {"resnet18", {false, {2, 2, 2, 2}}},  {"resnet26", {true, {2, 2, 2, 2}}},
      {"resnet34", {false, {3, 4, 6, 3}}},  {"resnet50", {true, {3, 4, 6, 3}}},
      {"resnet101", {true, {3, 4, 23, 3}}}, {"resnet152", {true, {3, 8, 36, 3}}}};
  std::string base = name.rfind("timm/", 0) == 0 ? name.substr(5) : name;
  base = base.substr(0, base.find('.'));  // "resnet50.a1_in1k": the pretrained tag
  const auto it = known.find(base);
  if (it != known.end()) {
    const auto& [bottleneck, depths] = it->second;
    const std::vector<int64_t> want(depths.begin(), depths.begin() + last_stage);
    if (bottleneck != c.bottleneck || want != c.depths) {
      auto blocks = [](bool b, const std::vector<int64_t>& d) {
        return std::string(b ? "Bottleneck" : "BasicBlock") + " blocks " + core::shape_string(d);
      };
      throw core::CheckpointError(file.path() +
                                  ": checkpoint does not match the model: backbone \"" + name +
                                  "\" has " + blocks(bottleneck, want) +
                                  " per stage, the checkpoint " + blocks(c.bottleneck, c.depths));
    }
  }
  return c;
}

TimmBlockImpl::TimmBlockImpl(bool bottleneck, int64_t in, int64_t width, int64_t out,
                             int64_t stride, int64_t first_dilation, int64_t dilation)
    : bottleneck(bottleneck) {
  if (bottleneck) {
    convs = {conv(in, width, 1, 1), conv(width, width, 3, stride, first_dilation),
             conv(width, out, 1, 1)};
  } else {
    convs = {conv(in, width, 3, stride, first_dilation), conv(width, out, 3, 1, dilation)};
  }
  for (size_t i = 0; i < convs.size(); ++i) {
    register_module("conv" + std::to_string(i + 1), convs[i]);
    norms.push_back(register_module("bn" + std::to_string(i + 1), norm(convs[i]->options.out)));
  }
  if (in != out || stride != 1) {
    auto down = register_module("downsample", std::make_shared<torch::nn::Module>());
    down_conv = down->register_module("0", conv(in, out, 1, stride));
    down_norm = down->register_module("1", norm(out));
  }
}

std::vector<layers::SiblingConvNorms::Pair> TimmBlockImpl::conv_norm_pairs() {
  std::vector<Pair> out;
  for (size_t i = 0; i < convs.size(); ++i) out.push_back({&convs[i], &norms[i], this});
  if (down_conv) out.push_back({&down_conv, &down_norm, named_children()["downsample"].get()});
  return out;
}

at::Tensor TimmBlockImpl::forward(const at::Tensor& x) const {
  // timm BasicBlock / Bottleneck.forward: conv -> bn -> act for all but the last pair, then
  // x += shortcut, act.
  if (folded) {
    auto run = [&](const layers::Conv2d& c, const at::Tensor& in, const at::Tensor& residual,
                   layers::Activation act) {
      return kernels::conv2d_bias_act(conv_kernel, in, c->weight, c->bias, residual,
                                      layers::conv_geometry(*c), act);
    };
    at::Tensor h = x;
    for (size_t i = 0; i + 1 < convs.size(); ++i)
      h = run(convs[i], h, at::Tensor(), layers::Activation::relu);
    const at::Tensor shortcut =
        down_conv ? run(down_conv, x, at::Tensor(), layers::Activation::none) : x;
    return run(convs.back(), h, shortcut, layers::Activation::relu);
  }
  at::Tensor h = x;
  for (size_t i = 0; i < convs.size(); ++i) {
    h = norms[i]->forward(convs[i]->forward(h));
    if (i + 1 < convs.size()) h = at::relu(h);
  }
  const at::Tensor shortcut = down_conv ? down_norm->forward(down_conv->forward(x)) : x;
  return at::relu(h + shortcut);
}

TimmResNetImpl::TimmResNetImpl(const TimmResNetConfig& c) : config(c) {
  conv1 = register_module("conv1", conv(c.num_channels, c.stem_width, 7, 2));
  bn1 = register_module("bn1", norm(c.stem_width));
  maxpool = register_module("maxpool",
                            std::make_shared<layers::MaxPool2dImpl>(layers::square_pool(3, 2, 1)));
  // timm make_blocks: the stem's stride 4, then each later stage halves the map until the
  // output stride is reached; from there on a stage dilates instead (stride 1, dilation x 2),
  // each block's first 3x3 taking the previous block's dilation.
  int64_t in = c.stem_width, net_stride = 4, dilation = 1, prev_dilation = 1;
  for (size_t s = 0; s < c.depths.size(); ++s) {
    int64_t stage_stride = s == 0 ? 1 : 2;
    if (net_stride >= c.output_stride) {
      dilation *= stage_stride;
      stage_stride = 1;
    } else {
      net_stride *= stage_stride;
    }
    std::vector<std::shared_ptr<TimmBlockImpl>> blocks;
    for (int64_t i = 0; i < c.depths[s]; ++i) {
      blocks.push_back(std::make_shared<TimmBlockImpl>(
          c.bottleneck, i == 0 ? in : c.outs[s], c.widths[s], c.outs[s], i == 0 ? stage_stride : 1,
          prev_dilation, dilation));
      prev_dilation = dilation;
    }
    stages.push_back(layers::register_list(*this, "layer" + std::to_string(s + 1), blocks));
    // register_list makes "layer{s}" a container whose children are "0", "1", ...
    in = c.outs[s];
  }
}

std::vector<layers::SiblingConvNorms::Pair> TimmResNetImpl::conv_norm_pairs() {
  return {{&conv1, &bn1, this}};
}

at::Tensor TimmResNetImpl::forward(const at::Tensor& pixel_values) const {
  return forward_stages(pixel_values).back();
}

std::vector<at::Tensor> TimmResNetImpl::forward_stages(const at::Tensor& pixel_values) const {
  const at::Tensor stem =
      folded ? kernels::conv2d_bias_act(conv_kernel, pixel_values, conv1->weight, conv1->bias,
                                        at::Tensor(), layers::conv_geometry(*conv1),
                                        layers::Activation::relu)
             : at::relu(bn1->forward(conv1->forward(pixel_values)));
  auto h = maxpool->forward(stem);
  std::vector<at::Tensor> maps;
  for (const auto& stage : stages) {
    for (const auto& block : stage) h = block->forward(h);
    maps.push_back(h);
  }
  return maps;
}

}  // namespace libreyolo::models::detr
