// PP-DocLayoutV3's mask branch: PPDocLayoutV3ScaleHead / MaskFeatFPN / EncoderMaskOutput and
// mask_to_box_coordinate (modeling_pp_doclayout_v3.py, transformers 5.17).

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "models/pp_doclayout_v3/modules.h"

namespace libreyolo::models::pp_doclayout_v3 {

namespace {

/// nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False) / F.interpolate with
/// scale_factor=2: the scale factors reach the kernel (not only the output size).
at::Tensor upsample2x(const at::Tensor& x) {
  return at::upsample_bilinear2d(x, std::nullopt, false, std::vector<double>{2.0, 2.0});
}

}  // namespace

layers::ConvNorm conv_layer(int64_t in, int64_t out, int64_t kernel) {
  layers::ConvNormOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.act = Activation::silu;
  o.conv_name = "convolution";
  o.norm_name = "normalization";
  return std::make_shared<layers::ConvNormImpl>(o);
}

MaskFeatFPNImpl::MaskFeatFPNImpl(std::vector<int64_t> in_channels, std::vector<int64_t> strides,
                                 int64_t feature_channels, int64_t out_channels) {
  // np.argsort(fpn_strides) (stable for the distinct strides a config has).
  order_.resize(strides.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int64_t a, int64_t b) { return strides[a] < strides[b]; });
  auto heads = register_module("scale_heads", std::make_shared<torch::nn::Module>());
  const int64_t base = strides[order_[0]];
  for (size_t i = 0; i < order_.size(); ++i) {
    const int64_t stride = strides[order_[i]];
    // head_length = max(1, int(log2(fpn_stride) - log2(base_stride))): a power-of-two ratio.
    int64_t length = 0;
    for (int64_t r = stride / base; r > 1; r /= 2) ++length;
    length = std::max<int64_t>(1, length);
    auto head = heads->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    auto list = head->register_module("layers", std::make_shared<torch::nn::Module>());
    std::vector<layers::ConvNorm> convs;
    std::vector<bool> up;
    int64_t index = 0;
    for (int64_t k = 0; k < length; ++k) {
      convs.push_back(list->register_module(
          std::to_string(index++),
          conv_layer(k == 0 ? in_channels[order_[i]] : feature_channels, feature_channels, 3)));
      up.push_back(stride != base);
      if (stride != base) ++index;  // the nn.Upsample entry
    }
    heads_.push_back(std::move(convs));
    upsample_after_.push_back(std::move(up));
  }
  output_conv_ = register_module("output_conv", conv_layer(feature_channels, out_channels, 3));
}

at::Tensor MaskFeatFPNImpl::forward(const std::vector<at::Tensor>& maps) const {
  auto head = [&](size_t i) {
    at::Tensor x = maps[order_[i]];
    for (size_t k = 0; k < heads_[i].size(); ++k) {
      x = heads_[i][k]->forward(x);
      if (upsample_after_[i][k]) x = upsample2x(x);
    }
    return x;
  };
  at::Tensor out = head(0);
  for (size_t i = 1; i < heads_.size(); ++i) {
    const std::vector<int64_t> size{out.size(2), out.size(3)};
    out = out + at::upsample_bilinear2d(head(i), size, /*align_corners=*/false);
  }
  return output_conv_->forward(out);
}

MaskBranch register_mask_branch(torch::nn::Module& encoder, const Config& c) {
  MaskBranch b;
  const std::vector<int64_t> in(c.feat_strides.size(), c.encoder_hidden_dim);
  const int64_t f = c.mask_feature_channels[0], m = c.mask_feature_channels[1];
  b.mask_feature_head = encoder.register_module(
      "mask_feature_head", std::make_shared<MaskFeatFPNImpl>(in, c.feat_strides, f, m));
  b.encoder_mask_lateral =
      encoder.register_module("encoder_mask_lateral", conv_layer(c.x4_feat_dim, m, 3));
  auto out = encoder.register_module("encoder_mask_output", std::make_shared<torch::nn::Module>());
  b.mask_output_base_conv = out->register_module("base_conv", conv_layer(m, m, 3));
  layers::Conv2dOptions o;
  o.in = m;
  o.out = c.num_prototypes;
  o.bias = true;
  b.mask_output_conv = out->register_module("conv", std::make_shared<layers::Conv2dImpl>(o));
  return b;
}

at::Tensor MaskBranch::forward(const std::vector<at::Tensor>& pan, const at::Tensor& x4) const {
  at::Tensor feat = upsample2x(mask_feature_head->forward(pan));
  feat = feat + encoder_mask_lateral->forward(x4);
  return mask_output_conv->forward(mask_output_base_conv->forward(feat));
}

at::Tensor mask_to_box_coordinate(const at::Tensor& mask, at::ScalarType dtype) {
  const int64_t h = mask.size(-2), w = mask.size(-1);
  const auto opts = at::TensorOptions().device(mask.device()).dtype(dtype);
  const at::Tensor xs = at::arange(w, opts).view({1, w}).expand({h, w});
  const at::Tensor ys = at::arange(h, opts).view({h, 1}).expand({h, w});
  // torch.finfo(dtype).max: an empty mask's minimum, zeroed below (inf would make NaN).
  const double finfo_max = dtype == at::kHalf       ? 65504.0
                           : dtype == at::kBFloat16 ? 3.3895313892515355e38
                                                    : std::numeric_limits<float>::max();
  const at::Tensor big = at::scalar_tensor(finfo_max, opts);
  auto extent = [&](const at::Tensor& coords) {
    const at::Tensor masked = coords * mask;
    const at::Tensor hi = std::get<0>(masked.flatten(-2).max(-1)) + 1;
    const at::Tensor lo = std::get<0>(at::where(mask, masked, big).flatten(-2).min(-1));
    return std::make_pair(lo, hi);
  };
  const auto [x_min, x_max] = extent(xs);
  const auto [y_min, y_max] = extent(ys);
  const at::Tensor non_empty = mask.any(-1).any(-1).unsqueeze(-1);
  const at::Tensor box = at::stack({x_min, y_min, x_max, y_max}, -1) * non_empty;
  // / [w, h, w, h] as scalars: equal to upstream's division by a tensor of those values (exact
  // in float), without a host-to-device copy (which a CUDA graph capture refuses).
  auto parts = box.unbind(-1);
  parts[0] = parts[0] / static_cast<double>(w);
  parts[1] = parts[1] / static_cast<double>(h);
  parts[2] = parts[2] / static_cast<double>(w);
  parts[3] = parts[3] / static_cast<double>(h);
  return at::stack({(parts[0] + parts[2]) / 2, (parts[1] + parts[3]) / 2, parts[2] - parts[0],
                    parts[3] - parts[1]},
                   -1);
}

}  // namespace libreyolo::models::pp_doclayout_v3
