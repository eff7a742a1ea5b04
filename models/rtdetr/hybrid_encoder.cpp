// RT-DETR hybrid encoder: AIFI (attention on the top level with a 2-D sin-cos position
// embedding) + CCFM (top-down FPN and bottom-up PAN of CSP/RepVGG blocks).
// transformers modeling_rt_detr.py RTDetrHybridEncoder / RTDetrAIFILayer / RTDetrCSPRepLayer.
#include "models/rtdetr/modules.h"

namespace libreyolo::models::rtdetr {
layers::ConvNorm conv_norm(const Config& c, int64_t in, int64_t out, int64_t kernel, int64_t stride,
                           Activation act, int64_t padding, int64_t groups) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.groups = groups;
  o.padding = padding >= 0 ? padding : (kernel - 1) / 2;
  o.act = act;
  o.eps = c.batch_norm_eps;
  return std::make_shared<layers::ConvNormImpl>(o);
}

at::Tensor sincos_position_embedding_2d(int64_t h, int64_t w, int64_t dim, double temperature,
                                        at::ScalarType dtype, const at::Device& device) {
  const int64_t pos_dim = dim / 4;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  auto omega = at::arange(pos_dim, f64) / static_cast<double>(pos_dim);
  omega = at::pow(temperature, omega).reciprocal();  // 1.0 / temperature**omega
  auto grids = at::meshgrid({at::arange(h, f64), at::arange(w, f64)}, "ij");
  const auto emb_h = at::outer(grids[0].flatten(), omega);
  const auto emb_w = at::outer(grids[1].flatten(), omega);
  return at::cat({emb_h.sin(), emb_h.cos(), emb_w.sin(), emb_w.cos()}, 1).to(dtype).unsqueeze(0);
}

EncoderLayerImpl::EncoderLayerImpl(const Config& c, bool v5_names)
    : act_(c.encoder_activation), normalize_before_(c.normalize_before) {
  const int64_t d = c.encoder_hidden_dim;
  layers::AttentionOptions a;
  a.embed_dim = d;
  a.num_heads = c.encoder_attention_heads;
  if (v5_names) a.o_name = "o_proj";
  self_attn = register_module("self_attn", std::make_shared<layers::AttentionImpl>(a));
  self_attn_layer_norm_ = register_module(
      "self_attn_layer_norm", std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  fc1_ = std::make_shared<layers::LinearImpl>(d, c.encoder_ffn_dim);
  fc2_ = std::make_shared<layers::LinearImpl>(c.encoder_ffn_dim, d);
  if (v5_names) {  // mlp.layers.{0,1}: layers[1](act(layers[0](x))), the same forward
    auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
    layers::register_list(*mlp, "layers", std::vector<layers::Linear>{fc1_, fc2_});
  } else {
    register_module("fc1", fc1_);
    register_module("fc2", fc2_);
  }
  final_layer_norm_ = register_module("final_layer_norm",
                                      std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor EncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& pos) const {
  const at::Tensor in = normalize_before_ ? self_attn_layer_norm_->forward(x) : x;
  const at::Tensor qk = pos.defined() ? in + pos : in;
  // x + attention and the LayerNorm after it in one add_layer_norm call: post-norm's
  // self_attn_layer_norm, or pre-norm's final_layer_norm (whose output upstream's
  // RTDetrEncoderLayer then keeps as the FFN's residual).
  const auto& norm = normalize_before_ ? final_layer_norm_ : self_attn_layer_norm_;
  const at::Tensor h = norm->forward_add(x, self_attn->forward(qk, qk, in)).second;
  // at::linear + activation, not linear_act (models/rtdetr/decoder.cpp says why).
  const at::Tensor ffn = fc2_->forward(layers::activate(act_, fc1_->forward(h)));
  return normalize_before_ ? h + ffn : final_layer_norm_->forward_add(h, ffn).second;
}

CSPRepLayerImpl::CSPRepLayerImpl(const Config& c)
    : CSPRepLayerImpl(c, 2 * c.encoder_hidden_dim, c.encoder_hidden_dim, 3, c.hidden_expansion) {}

RepVggBlockImpl::RepVggBlockImpl(const Config& c, int64_t channels) {
  act = c.activation;
  conv1 = register_module("conv1", conv_norm(c, channels, channels, 3, 1, Activation::none, 1));
  conv2 = register_module("conv2", conv_norm(c, channels, channels, 1, 1, Activation::none, 0));
}

at::Tensor RepVggBlockImpl::forward(const at::Tensor& x) const {
  // Re-parameterised: conv1 is the merged 3x3 kernel with the block's activation.
  if (reparameterized) return conv1->forward(x);
  return layers::activate(act, conv1->forward(x) + conv2->forward(x));
}

CSPRepLayerImpl::CSPRepLayerImpl(const Config& c, int64_t in, int64_t out, int64_t num_blocks,
                                 double expansion) {
  const auto hidden = static_cast<int64_t>(static_cast<double>(out) * expansion);
  conv1_ = register_module("conv1", conv_norm(c, in, hidden, 1, 1, c.activation));
  conv2_ = register_module("conv2", conv_norm(c, in, hidden, 1, 1, c.activation));
  std::vector<std::shared_ptr<RepVggBlockImpl>> blocks;
  for (int64_t i = 0; i < num_blocks; ++i)
    blocks.push_back(std::make_shared<RepVggBlockImpl>(c, hidden));
  bottlenecks_ = layers::register_list(*this, "bottlenecks", blocks);
  if (hidden != out)
    conv3_ = register_module("conv3", conv_norm(c, hidden, out, 1, 1, c.activation));
}

at::Tensor CSPRepLayerImpl::forward(const at::Tensor& input) const {
  // Both convolutions read the input. D-FINE hands over a channel half of a channels_last map
  // (RepNCSPELAN4's split), which each convolution would copy into a dense one: copied once here.
  const at::Tensor x = input.contiguous(input.suggest_memory_format());
  at::Tensor h1 = conv1_->forward(x);
  for (const auto& block : bottlenecks_) h1 = block->forward(h1);
  const at::Tensor h2 = conv2_->forward(x);
  const at::Tensor sum = h1 + h2;
  return conv3_ ? conv3_->forward(sum) : sum;
}

CCFMFactories rtdetr_ccfm(const Config& c) {
  const int64_t e = c.encoder_hidden_dim;
  CCFMFactories f;
  f.lateral_conv = [c, e] { return ccfm_block(conv_norm(c, e, e, 1, 1, c.activation)); };
  f.fpn_block = [c] { return ccfm_block(std::make_shared<CSPRepLayerImpl>(c)); };
  f.downsample_conv = [c, e] { return ccfm_block(conv_norm(c, e, e, 3, 2, c.activation)); };
  f.pan_block = f.fpn_block;
  return f;
}

HybridEncoderImpl::HybridEncoderImpl(const Config& c, const CCFMFactories& blocks)
    : encode_proj_layers_(c.encode_proj_layers),
      hidden_dim_(c.encoder_hidden_dim),
      temperature_(c.positional_encoding_temperature),
      use_pos_(!c.eval_size_set),
      fuse_sum_(blocks.fuse_sum),
      position_embedding_(blocks.position_embedding ? blocks.position_embedding
                                                    : sincos_position_embedding_2d) {
  // On disk "encoder.{i}.layers.{j}" (transformers v5 in memory: aifi.{i}; DEIMv2 on disk too).
  auto aifi =
      register_module(blocks.v5_names ? "aifi" : "encoder", std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < c.encode_proj_layers.size(); ++i) {
    std::vector<std::shared_ptr<EncoderLayerImpl>> ls;
    for (int64_t j = 0; j < c.encoder_layers; ++j)
      ls.push_back(std::make_shared<EncoderLayerImpl>(c, blocks.v5_names));
    auto block = aifi->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    aifi_.push_back(layers::register_list(*block, "layers", ls));
  }
  const size_t stages = c.encoder_in_channels.size() - 1;
  auto make = [&](const std::string& name, const std::function<CCFMBlock()>& factory) {
    auto list = register_module(name, std::make_shared<torch::nn::Module>());
    std::vector<CCFMBlock> out;
    for (size_t i = 0; i < stages; ++i) {
      out.push_back(factory());
      list->register_module(std::to_string(i), out.back().module);
    }
    return out;
  };
  // Registration order = transformers' (lateral, fpn, downsample, pan) for readable dumps.
  lateral_convs_ = make("lateral_convs", blocks.lateral_conv);
  fpn_blocks_ = make("fpn_blocks", blocks.fpn_block);
  downsample_convs_ = make("downsample_convs", blocks.downsample_conv);
  pan_blocks_ = make("pan_blocks", blocks.pan_block);
}

std::vector<at::Tensor> HybridEncoderImpl::forward(std::vector<at::Tensor> fm) const {
  // AIFI on the levels of encode_proj_layers.
  for (size_t i = 0; i < aifi_.size() && !aifi_[i].empty(); ++i) {
    at::Tensor& x = fm[encode_proj_layers_[i]];
    const int64_t B = x.size(0), H = x.size(2), W = x.size(3);
    at::Tensor h = x.flatten(2).transpose(1, 2);
    at::Tensor pos;
    if (use_pos_)
      pos = positions_.get({H, W, static_cast<int64_t>(h.scalar_type())}, h.device(), [&] {
        return position_embedding_(H, W, hidden_dim_, temperature_, h.scalar_type(), h.device());
      });
    for (const auto& layer : aifi_[i]) h = layer->forward(h, pos);
    // Back to (B, C, H, W) in the memory format the map came in: with channels_last (the
    // layout) the transposed tokens already are NHWC, so this is a view where a plain
    // .contiguous() made an NCHW copy that the next convolution converted back.
    const auto format = x.suggest_memory_format();
    x = h.transpose(1, 2).reshape({B, hidden_dim_, H, W}).contiguous(format);
  }
  auto fuse = [this](const at::Tensor& a, const at::Tensor& b) {
    return fuse_sum_ ? a + b : at::cat({a, b}, 1);
  };
  // Top-down FPN.
  const size_t n = lateral_convs_.size();
  std::vector<at::Tensor> fpn{fm.back()};
  for (size_t idx = 0; idx < n; ++idx) {
    const at::Tensor& backbone_map = fm[n - idx - 1];
    at::Tensor top = lateral_convs_[idx].forward(fpn.back());
    fpn.back() = top;
    top = at::upsample_nearest2d(top, std::nullopt, std::vector<double>{2.0, 2.0});
    fpn.push_back(fpn_blocks_[idx].forward(fuse(top, backbone_map)));
  }
  std::reverse(fpn.begin(), fpn.end());
  // Bottom-up PAN.
  std::vector<at::Tensor> pan{fpn[0]};
  for (size_t idx = 0; idx < n; ++idx) {
    const at::Tensor down = downsample_convs_[idx].forward(pan.back());
    pan.push_back(pan_blocks_[idx].forward(fuse(down, fpn[idx + 1])));
  }
  return pan;
}

}  // namespace libreyolo::models::rtdetr
