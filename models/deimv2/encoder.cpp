// DEIMv2 encoders: the hybrid encoder's blocks (Deimv2CSPRepLayer, Deimv2RepNCSPELAN5, D-FINE's
// SCDown, wired by rtdetr::HybridEncoderImpl with sum fusion) and Deimv2LiteEncoder
// (modeling_deimv2.py, transformers 5.17).
#include <cmath>

#include "models/deimv2/modules.h"

namespace libreyolo::models::deimv2 {

namespace {

int64_t num_blocks(const Config& c) {
  // round(3 * depth_mult): Python's round is half-to-even, as nearbyint.
  return static_cast<int64_t>(std::nearbyint(3.0 * c.depth_mult));
}

}  // namespace

CSPRepLayerImpl::CSPRepLayerImpl(const Config& c, int64_t in, int64_t out, int64_t blocks)
    : hidden_(out) {
  conv1_ = register_module("conv1", rtdetr::conv_norm(c, in, 2 * hidden_, 1, 1, c.activation));
  std::vector<std::shared_ptr<rtdetr::RepVggBlockImpl>> list;
  for (int64_t i = 0; i < blocks; ++i)
    list.push_back(std::make_shared<rtdetr::RepVggBlockImpl>(c, hidden_));
  bottlenecks_ = layers::register_list(*this, "bottlenecks", list);
  if (c.trailing_conv)
    conv2_ = register_module("conv2", rtdetr::conv_norm(c, hidden_, out, 3, 1, c.activation));
}

at::Tensor CSPRepLayerImpl::forward(const at::Tensor& x) const {
  const auto parts = conv1_->forward(x).chunk(2, 1);
  at::Tensor h = parts[1];
  for (const auto& block : bottlenecks_) h = block->forward(h);
  const at::Tensor sum = parts[0] + h;
  return conv2_ ? conv2_->forward(sum) : sum;
}

RepNCSPELAN5Impl::RepNCSPELAN5Impl(const Config& c) : half_(c.encoder_hidden_dim) {
  const int64_t e = c.encoder_hidden_dim;
  // round(hidden_expansion * E // 2): Python's // on a float floors, round() is half-to-even.
  const int64_t csp = static_cast<int64_t>(
      std::nearbyint(std::floor(c.hidden_expansion * static_cast<double>(e) / 2.0)));
  const int64_t blocks = num_blocks(c);
  conv1_ = register_module("conv1", rtdetr::conv_norm(c, e, 2 * e, 1, 1, c.activation));
  csp_rep1_ = register_module("csp_rep1", std::make_shared<CSPRepLayerImpl>(c, e, csp, blocks));
  csp_rep2_ = register_module("csp_rep2", std::make_shared<CSPRepLayerImpl>(c, csp, csp, blocks));
  conv2_ = register_module("conv2", rtdetr::conv_norm(c, 2 * e + 2 * csp, e, 1, 1, c.activation));
}

at::Tensor RepNCSPELAN5Impl::forward(const at::Tensor& x) const {
  const auto y = conv1_->forward(x).chunk(2, 1);
  const at::Tensor b1 = csp_rep1_->forward(y[1]);
  const at::Tensor b2 = csp_rep2_->forward(b1);
  return conv2_->forward(at::cat({y[0], y[1], b1, b2}, 1));
}

rtdetr::CCFMFactories deimv2_ccfm(const Config& c) {
  const int64_t e = c.encoder_hidden_dim;
  rtdetr::CCFMFactories f;
  f.lateral_conv = [c, e] {
    return rtdetr::ccfm_block(rtdetr::conv_norm(c, e, e, 1, 1, Activation::none));
  };
  f.fpn_block = [c] { return rtdetr::ccfm_block(std::make_shared<RepNCSPELAN5Impl>(c)); };
  f.downsample_conv = [c] { return rtdetr::ccfm_block(std::make_shared<dfine::SCDownImpl>(c)); };
  f.pan_block = f.fpn_block;
  f.fuse_sum = true;
  f.v5_names = true;
  return f;
}

LiteEncoderImpl::LiteEncoderImpl(const Config& c) {
  const int64_t e = c.encoder_hidden_dim;
  std::vector<layers::ConvNorm> proj;
  for (auto in : c.encoder_in_channels)
    proj.push_back(rtdetr::conv_norm(c, in, e, 1, 1, Activation::none));
  input_proj_ = layers::register_list(*this, "input_proj", proj);
  down_conv1_ = register_module("down_conv1", rtdetr::conv_norm(c, e, e, 1, 1, c.activation));
  down_conv2_ = register_module("down_conv2", rtdetr::conv_norm(c, e, e, 1, 1, c.activation));
  bi_fusion_conv_ =
      register_module("bi_fusion_conv", rtdetr::conv_norm(c, e, e, 1, 1, c.activation));
  fpn_block_ = register_module("fpn_block", std::make_shared<RepNCSPELAN5Impl>(c));
  pan_block_ = register_module("pan_block", std::make_shared<RepNCSPELAN5Impl>(c));
}

std::vector<at::Tensor> LiteEncoderImpl::forward(const std::vector<at::Tensor>& features) const {
  // nn.AvgPool2d(kernel_size=3, stride=2, padding=1): count_include_pad, floor mode.
  auto pool = [](const at::Tensor& x) { return at::avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}); };
  std::vector<at::Tensor> p;
  for (size_t i = 0; i < features.size(); ++i) p.push_back(input_proj_[i]->forward(features[i]));
  p.push_back(down_conv1_->forward(pool(p.back())));
  p.back() = bi_fusion_conv_->forward(p.back() + at::adaptive_avg_pool2d(p.back(), {1, 1}));
  const at::Tensor up = at::upsample_nearest2d(p[1], std::nullopt, std::vector<double>{2.0, 2.0});
  const at::Tensor fpn = fpn_block_->forward(p[0] + up);
  const at::Tensor pan = pan_block_->forward(p[1] + down_conv2_->forward(pool(fpn)));
  return {fpn, pan};
}

}  // namespace libreyolo::models::deimv2
