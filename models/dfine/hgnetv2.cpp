// HGNetV2 backbone: stem, stages of HG blocks (transformers modeling_hgnet_v2.py, v5.17).
#include "models/dfine/hgnetv2.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace libreyolo::models::dfine {
namespace {

using layers::Activation;

layers::ConvNormOptions conv_layer_options(const HGNetV2Config& c, int64_t in, int64_t out,
                                           int64_t kernel, int64_t stride, int64_t groups,
                                           Activation act) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.groups = groups;
  o.padding = (kernel - 1) / 2;  // the 2x2 stem convs have no padding (F.pad does it)
  o.act = act;
  o.frozen = c.frozen_batch_norm;
  o.eps = 1e-5;  // nn.BatchNorm2d default: HGNetV2 has no eps field
  o.conv_name = "convolution";
  o.norm_name = "normalization";
  return o;
}

std::vector<bool> bool_list(const core::ConfigView& b, const std::string& field,
                            const std::vector<bool>& fallback) {
  if (!b.has(field)) return fallback;
  const auto& raw = b.raw(field);
  if (!raw.is_array()) b.fail(field, "expected a list of booleans");
  std::vector<bool> out;
  for (const auto& v : raw) {
    if (!v.is_boolean()) b.fail(field, "expected a list of booleans");
    out.push_back(v.get<bool>());
  }
  return out;
}

/// F.pad(x, (0, 1, 0, 1)): one zero column on the right and one zero row at the bottom, in x's
/// memory format. On the CPU constant_pad_nd fills the whole output before copying x in (at
/// 32 x 321 x 321 the fill cost as much as the copy); there only the border is zeroed. Same
/// values. Other devices keep constant_pad_nd (two kernels, not three; not measured there).
at::Tensor pad_right_bottom(const at::Tensor& x) {
  if (!x.is_cpu()) return at::constant_pad_nd(x, {0, 1, 0, 1});
  const int64_t H = x.size(2), W = x.size(3);
  at::Tensor out = at::empty({x.size(0), x.size(1), H + 1, W + 1},
                             x.options().memory_format(x.suggest_memory_format()));
  out.narrow(2, 0, H).narrow(3, 0, W).copy_(x);
  out.select(2, H).zero_();
  out.narrow(2, 0, H).select(3, W).zero_();
  return out;
}

}  // namespace

HGNetV2Config HGNetV2Config::parse(const core::ConfigView& b, size_t unchecked_outputs) {
  HGNetV2Config c;
  b.get_enum("model_type", "hgnet_v2", {"hgnet_v2"});
  c.num_channels = b.get_int("num_channels", c.num_channels);
  c.embedding_size = b.get_int("embedding_size", c.embedding_size);
  c.stem_channels = b.get_int_list("stem_channels", c.stem_channels);
  c.stem_strides = b.get_int_list("stem_strides", c.stem_strides);
  c.stage_in_channels = b.get_int_list("stage_in_channels", c.stage_in_channels);
  c.stage_mid_channels = b.get_int_list("stage_mid_channels", c.stage_mid_channels);
  c.stage_out_channels = b.get_int_list("stage_out_channels", c.stage_out_channels);
  c.stage_num_blocks = b.get_int_list("stage_num_blocks", c.stage_num_blocks);
  c.stage_downsample_strides =
      b.get_int_list("stage_downsample_strides", c.stage_downsample_strides);
  c.stage_kernel_size = b.get_int_list("stage_kernel_size", c.stage_kernel_size);
  c.stage_numb_of_layers = b.get_int_list("stage_numb_of_layers", c.stage_numb_of_layers);
  c.stage_downsample = bool_list(b, "stage_downsample", c.stage_downsample);
  c.stage_light_block = bool_list(b, "stage_light_block", c.stage_light_block);
  c.hidden_sizes = b.get_int_list("hidden_sizes", c.hidden_sizes);
  c.out_indices = b.get_int_list("out_indices", c.out_indices);
  c.use_learnable_affine_block =
      b.get_bool("use_learnable_affine_block", c.use_learnable_affine_block);
  const std::string act = b.get_string("hidden_act", "relu");
  try {
    c.hidden_act = layers::activation_from_name(act);
  } catch (const std::invalid_argument& e) {
    b.fail("hidden_act", e.what());
  }

  if (c.stem_channels.size() != 3) b.fail("stem_channels", "expected 3 entries");
  if (c.stem_strides.size() != 5) b.fail("stem_strides", "expected 5 entries");
  if (c.stem_channels[0] != c.num_channels)
    b.fail("stem_channels", "first entry must equal num_channels");
  if (c.stem_channels[1] < 2 || c.stem_channels[1] % 2 != 0)
    b.fail("stem_channels", "second entry must be even (stem2a halves it)");
  for (auto s : c.stem_strides)
    if (s <= 0) b.fail("stem_strides", "must be positive");
  if (c.stem_strides[1] != 1 || c.stem_strides[2] != 1)
    b.fail("stem_strides",
           "entries 1 and 2 (stem2a, stem2b) must be 1: their output is "
           "concatenated with a stride-1 max pool");
  const size_t n = c.stage_in_channels.size();
  if (n == 0) b.fail("stage_in_channels", "needs at least one stage");
  auto same_size = [&](const char* field, size_t size) {
    if (size != n) b.fail(field, "needs one entry per stage (" + std::to_string(n) + ")");
  };
  same_size("stage_mid_channels", c.stage_mid_channels.size());
  same_size("stage_out_channels", c.stage_out_channels.size());
  same_size("stage_num_blocks", c.stage_num_blocks.size());
  same_size("stage_downsample", c.stage_downsample.size());
  same_size("stage_downsample_strides", c.stage_downsample_strides.size());
  same_size("stage_light_block", c.stage_light_block.size());
  same_size("stage_kernel_size", c.stage_kernel_size.size());
  same_size("stage_numb_of_layers", c.stage_numb_of_layers.size());
  same_size("hidden_sizes", c.hidden_sizes.size());
  for (size_t s = 0; s < n; ++s) {
    const int64_t in_prev = s == 0 ? c.stem_channels[2] : c.stage_out_channels[s - 1];
    if (c.stage_in_channels[s] != in_prev)
      b.fail("stage_in_channels", "entry " + std::to_string(s) + " must equal the previous " +
                                      "output channels (" + std::to_string(in_prev) + ")");
    if (c.stage_num_blocks[s] < 1 || c.stage_numb_of_layers[s] < 1 || c.stage_mid_channels[s] < 1)
      b.fail("stage_num_blocks", "blocks, layers and mid channels must be positive");
    if (c.stage_out_channels[s] < 2 || c.stage_out_channels[s] % 2 != 0)
      b.fail("stage_out_channels", "must be even (the aggregation squeezes to out/2)");
    if (c.stage_kernel_size[s] < 1 || c.stage_kernel_size[s] % 2 == 0)
      b.fail("stage_kernel_size", "must be odd and positive");
    if (c.stage_downsample_strides[s] < 1) b.fail("stage_downsample_strides", "must be positive");
    // BackboneMixin.channels comes from hidden_sizes (num_features = [embedding_size] +
    // hidden_sizes, indexed by out_indices); the maps have stage_out_channels. Only the stages
    // the backbone returns must agree: DFineConfig's default HGNetV2 (D-FINE L as published)
    // has hidden_sizes[0] 256 against stage_out_channels[0] 128 for the unreturned stage1.
    const auto checked_from = c.out_indices.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                          unchecked_outputs, c.out_indices.size()));
    const bool returned = std::find(checked_from, c.out_indices.end(),
                                    static_cast<int64_t>(s) + 1) != c.out_indices.end();
    if (returned && c.hidden_sizes[s] != c.stage_out_channels[s])
      b.fail("hidden_sizes",
             "must equal stage_out_channels for the stages in out_indices (transformers derives "
             "the backbone's channels from hidden_sizes)");
  }
  for (auto i : c.out_indices)
    if (i < 0 || i > static_cast<int64_t>(n))
      b.fail("out_indices", "index " + std::to_string(i) + " out of range");
  return c;
}

std::vector<int64_t> HGNetV2Config::out_channels() const {
  std::vector<int64_t> out;
  for (auto i : out_indices) out.push_back(i == 0 ? stem_channels[2] : stage_out_channels[i - 1]);
  return out;
}

std::vector<int64_t> HGNetV2Config::out_strides() const {
  std::vector<int64_t> stride{stem_strides[0] * stem_strides[3] * stem_strides[4]};
  for (size_t s = 0; s < stage_downsample.size(); ++s)
    stride.push_back(stride.back() * (stage_downsample[s] ? stage_downsample_strides[s] : 1));
  std::vector<int64_t> out;
  for (auto i : out_indices) out.push_back(stride[i]);
  return out;
}

ConvLayerImpl::ConvLayerImpl(const HGNetV2Config& c, int64_t in, int64_t out, int64_t kernel,
                             int64_t stride, int64_t groups, Activation act)
    : layers::ConvNormImpl(conv_layer_options(c, in, out, kernel, stride, groups, act)) {
  if (act != Activation::none && c.use_learnable_affine_block) {
    auto lab = register_module("lab", std::make_shared<torch::nn::Module>());
    lab_scale_ = lab->register_parameter("scale", at::ones({1}), /*requires_grad=*/false);
    lab_bias_ = lab->register_parameter("bias", at::zeros({1}), /*requires_grad=*/false);
  }
}

at::Tensor ConvLayerImpl::forward(const at::Tensor& x) const {
  at::Tensor y = layers::ConvNormImpl::forward(x);
  // HGNetV2LearnableAffineBlock: self.scale * hidden_state + self.bias (same operand order).
  if (lab_scale_.defined()) y = lab_scale_ * y + lab_bias_;
  return y;
}

BasicLayerImpl::BasicLayerImpl(const HGNetV2Config& c, int64_t in, int64_t mid, int64_t out,
                               int64_t layer_num, int64_t kernel, bool residual, bool light)
    : residual_(residual) {
  auto list = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < layer_num; ++i) {
    const int64_t cin = i == 0 ? in : mid;
    if (light) {
      // HGNetV2ConvLayerLight: 1x1 without activation (so without LAB), depthwise kxk.
      auto block = list->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
      auto a = block->register_module(
          "conv1", std::make_shared<ConvLayerImpl>(c, cin, mid, 1, 1, 1, Activation::none));
      auto b = block->register_module(
          "conv2", std::make_shared<ConvLayerImpl>(c, mid, mid, kernel, 1, mid, c.hidden_act));
      layers_.push_back({a, b});
    } else {
      layers_.push_back(
          {list->register_module(std::to_string(i), std::make_shared<ConvLayerImpl>(
                                                        c, cin, mid, kernel, 1, 1, c.hidden_act))});
    }
  }
  auto agg = register_module("aggregation", std::make_shared<torch::nn::Module>());
  squeeze_ = agg->register_module(
      "0",
      std::make_shared<ConvLayerImpl>(c, in + layer_num * mid, out / 2, 1, 1, 1, c.hidden_act));
  excitation_ = agg->register_module(
      "1", std::make_shared<ConvLayerImpl>(c, out / 2, out, 1, 1, 1, c.hidden_act));
}

at::Tensor BasicLayerImpl::forward(const at::Tensor& x) const {
  std::vector<at::Tensor> outs{x};
  at::Tensor h = x;
  for (const auto& convs : layers_) {
    for (const auto& conv : convs) h = conv->forward(h);
    outs.push_back(h);
  }
  h = excitation_->forward(squeeze_->forward(at::cat(outs, 1)));
  return residual_ ? h + x : h;
}

BackboneImpl::BackboneImpl(const HGNetV2Config& c) : out_indices_(c.out_indices) {
  auto embedder = register_module("embedder", std::make_shared<torch::nn::Module>());
  const auto& sc = c.stem_channels;
  const auto& ss = c.stem_strides;
  const auto act = c.hidden_act;
  stem1_ = embedder->register_module(
      "stem1", std::make_shared<ConvLayerImpl>(c, sc[0], sc[1], 3, ss[0], 1, act));
  stem2a_ = embedder->register_module(
      "stem2a", std::make_shared<ConvLayerImpl>(c, sc[1], sc[1] / 2, 2, ss[1], 1, act));
  stem2b_ = embedder->register_module(
      "stem2b", std::make_shared<ConvLayerImpl>(c, sc[1] / 2, sc[1], 2, ss[2], 1, act));
  stem3_ = embedder->register_module(
      "stem3", std::make_shared<ConvLayerImpl>(c, sc[1] * 2, sc[1], 3, ss[3], 1, act));
  stem4_ = embedder->register_module(
      "stem4", std::make_shared<ConvLayerImpl>(c, sc[1], sc[2], 1, ss[4], 1, act));
  pool_ = embedder->register_module(
      "pool", std::make_shared<layers::MaxPool2dImpl>(layers::square_pool(2, 1, 0, /*ceil=*/true)));

  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto stages = encoder->register_module("stages", std::make_shared<torch::nn::Module>());
  for (size_t s = 0; s < c.stage_in_channels.size(); ++s) {
    auto stage = stages->register_module(std::to_string(s), std::make_shared<torch::nn::Module>());
    Stage st;
    const int64_t in = c.stage_in_channels[s], out = c.stage_out_channels[s];
    if (c.stage_downsample[s]) {
      // Depthwise 3x3, no activation (so no LAB either).
      st.downsample = stage->register_module(
          "downsample", std::make_shared<ConvLayerImpl>(c, in, in, 3, c.stage_downsample_strides[s],
                                                        in, Activation::none));
    }
    std::vector<std::shared_ptr<BasicLayerImpl>> blocks;
    for (int64_t b = 0; b < c.stage_num_blocks[s]; ++b)
      blocks.push_back(std::make_shared<BasicLayerImpl>(
          c, b == 0 ? in : out, c.stage_mid_channels[s], out, c.stage_numb_of_layers[s],
          c.stage_kernel_size[s], /*residual=*/b != 0, c.stage_light_block[s]));
    st.blocks = layers::register_list(*stage, "blocks", blocks);
    stages_.push_back(std::move(st));
  }
}

std::vector<at::Tensor> BackboneImpl::forward(const at::Tensor& pixel_values) const {
  // HGNetV2Embeddings.forward: two branches on the zero-padded stem1 output.
  at::Tensor e = pad_right_bottom(stem1_->forward(pixel_values));
  at::Tensor a = pad_right_bottom(stem2a_->forward(e));
  a = stem2b_->forward(a);
  const at::Tensor pooled = pool_->forward(e);
  e = stem4_->forward(stem3_->forward(at::cat({pooled, a}, 1)));

  std::vector<at::Tensor> hidden{e};
  at::Tensor h = e;
  for (const auto& st : stages_) {
    if (st.downsample) h = st.downsample->forward(h);
    for (const auto& block : st.blocks) h = block->forward(h);
    hidden.push_back(h);
  }
  std::vector<at::Tensor> out;
  for (auto i : out_indices_) out.push_back(hidden[i]);
  return out;
}

}  // namespace libreyolo::models::dfine
