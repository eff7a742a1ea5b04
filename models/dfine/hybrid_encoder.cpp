// D-FINE hybrid encoder blocks: RepNCSPELAN4 (FPN/PAN) and SCDown (PAN downsampling), wired by
// rtdetr::HybridEncoderImpl (modeling_d_fine.py DFineHybridEncoder, DFineRepNCSPELAN4,
// DFineSCDown).
#include <cmath>

#include "models/dfine/modules.h"

namespace libreyolo::models::dfine {

RepNCSPELAN4Impl::RepNCSPELAN4Impl(const Config& c) : half_(c.encoder_hidden_dim) {
  const int64_t e = c.encoder_hidden_dim;
  // round(hidden_expansion * E // 2): Python's // on a float floors, round() is half-to-even.
  const int64_t c4 = static_cast<int64_t>(
      std::nearbyint(std::floor(c.hidden_expansion * static_cast<double>(e) / 2.0)));
  const int64_t blocks = static_cast<int64_t>(std::nearbyint(3.0 * c.depth_mult));
  // The activation of these four is hard-coded silu upstream (act="silu"), not the config's.
  conv1_ = register_module("conv1", rtdetr::conv_norm(c, 2 * e, 2 * e, 1, 1, Activation::silu));
  csp_rep1_ =
      register_module("csp_rep1", std::make_shared<rtdetr::CSPRepLayerImpl>(c, e, c4, blocks, 1.0));
  conv2_ = register_module("conv2", rtdetr::conv_norm(c, c4, c4, 3, 1, Activation::silu));
  csp_rep2_ = register_module("csp_rep2",
                              std::make_shared<rtdetr::CSPRepLayerImpl>(c, c4, c4, blocks, 1.0));
  conv3_ = register_module("conv3", rtdetr::conv_norm(c, c4, c4, 3, 1, Activation::silu));
  conv4_ =
      register_module("conv4", rtdetr::conv_norm(c, 2 * e + 2 * c4, e, 1, 1, Activation::silu));
}

at::Tensor RepNCSPELAN4Impl::forward(const at::Tensor& x) const {
  const auto y = conv1_->forward(x).split({half_, half_}, 1);
  const at::Tensor b1 = conv2_->forward(csp_rep1_->forward(y[1]));
  const at::Tensor b2 = conv3_->forward(csp_rep2_->forward(b1));
  return conv4_->forward(at::cat({y[0], y[1], b1, b2}, 1));
}

SCDownImpl::SCDownImpl(const Config& c) {
  const int64_t e = c.encoder_hidden_dim;
  conv1_ = register_module("conv1", rtdetr::conv_norm(c, e, e, 1, 1, Activation::none));
  conv2_ = register_module("conv2", rtdetr::conv_norm(c, e, e, 3, 2, Activation::none, -1, e));
}

at::Tensor SCDownImpl::forward(const at::Tensor& x) const {
  return conv2_->forward(conv1_->forward(x));
}

rtdetr::CCFMFactories dfine_ccfm(const Config& c) {
  const int64_t e = c.encoder_hidden_dim;
  rtdetr::CCFMFactories f;
  f.lateral_conv = [c, e] {
    return rtdetr::ccfm_block(rtdetr::conv_norm(c, e, e, 1, 1, Activation::none));
  };
  f.fpn_block = [c] { return rtdetr::ccfm_block(std::make_shared<RepNCSPELAN4Impl>(c)); };
  f.downsample_conv = [c] { return rtdetr::ccfm_block(std::make_shared<SCDownImpl>(c)); };
  f.pan_block = f.fpn_block;
  return f;
}

}  // namespace libreyolo::models::dfine
