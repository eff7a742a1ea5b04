// Owlv2ImageProcessor's pixel pipeline (processor.h owlv2_pixel_values): transformers 5.17
// models/owlv2/image_processing_owlv2.py (_preprocess, pad, resize) and torchvision 0.26
// transforms/v2/functional/_misc.py (gaussian_blur_image, _get_gaussian_kernel1d/2d), op for op
// so that the float32 rounding is theirs.
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "models/image/processor.h"

namespace libreyolo::image {
namespace {

/// torchvision _get_gaussian_kernel1d: softmax(-(linspace(-lim, lim, k) / sigma)^2), float32.
at::Tensor gaussian_kernel1d(int64_t k, double sigma, const at::Device& device) {
  const double lim = static_cast<double>(k - 1) / (2.0 * std::sqrt(2.0));
  return at::linspace(lim * -1.0, lim, k, at::TensorOptions().dtype(at::kFloat).device(device))
      .div(sigma)
      .pow(2)
      .neg()
      .softmax(0);
}

/// Owlv2ImageProcessor.resize of x (1, 3, S, S') float32 to (height, width).
at::Tensor owlv2_resize(const at::Tensor& x, int64_t height, int64_t width) {
  // factors = tensor(input_shape[2:]) / tensor(output_shape): int64 / int64 -> float32.
  const auto in = at::tensor(std::vector<int64_t>{x.size(2), x.size(3)});
  const auto out = at::tensor(std::vector<int64_t>{height, width});
  const auto sigma = ((in / out - 1) / 2).clamp_min(0);
  at::Tensor filtered = x;
  if (!sigma.eq(0).any().item<bool>()) {
    const auto ks = (2 * at::ceil(3 * sigma).to(at::kInt) + 1).to(at::kLong);
    // gaussian_blur(image, (k[0], k[1]), sigma=[s[0], s[1]]): index 0 is the x direction there.
    const int64_t kx = ks[0].item<int64_t>(), ky = ks[1].item<int64_t>();
    const double sx = sigma[0].item<double>(), sy = sigma[1].item<double>();
    // torchvision convolves with the 2-D kernel outer(ky, kx); the same kernel as a vertical then
    // a horizontal 1-D pass costs ky + kx multiply-adds a pixel instead of ky * kx (a 6000 x 6000
    // photograph for 960: 34 instead of 289; the 2-D form held a preprocessing thread for
    // minutes). The sums differ by float32 rounding only (OwlParity pixel_values bar 1e-5).
    const int64_t channels = x.size(1);
    const auto wy = gaussian_kernel1d(ky, sy, x.device()).view({1, 1, ky, 1});
    const auto wx = gaussian_kernel1d(kx, sx, x.device()).view({1, 1, 1, kx});
    const auto padded = at::reflection_pad2d(x, {kx / 2, kx / 2, ky / 2, ky / 2});
    const std::vector<int64_t> one{1, 1}, zero{0, 0};
    const auto vertical =
        at::conv2d(padded, wy.expand({channels, 1, ky, 1}), std::nullopt, one, zero, one, channels);
    filtered = at::conv2d(vertical, wx.expand({channels, 1, 1, kx}), std::nullopt, one, zero, one,
                          channels);
  }
  // TorchvisionBackend.resize(antialias=False), BILINEAR (the resample argument is not passed on).
  return at::upsample_bilinear2d(filtered, {height, width}, /*align_corners=*/false);
}

}  // namespace

at::Tensor owlv2_pixel_values(const ProcessorConfig& c, const at::Tensor& image_u8) {
  // rescale_and_normalize(do_rescale, no normalize): `image * scale` (uint8 * float -> float32).
  at::Tensor x = c.do_rescale ? image_u8 * c.rescale_factor : image_u8.to(at::kFloat);
  x = x.unsqueeze(0);
  if (c.do_pad) {
    const int64_t h = x.size(2), w = x.size(3), side = std::max(h, w);
    // The square is padded, blurred and resized in float32: a thin image within the decoder's
    // pixel limit (40000 x 1000) would pad to 40000 x 40000, 19 GB.
    if (side > kOwlv2MaxPaddedSide)
      throw std::invalid_argument(
          c10::str("image ", w, "x", h, ": Owlv2ImageProcessor pads it to a ", side, "x", side,
                   " square, larger than the ", kOwlv2MaxPaddedSide, "x", kOwlv2MaxPaddedSide,
                   " this server preprocesses (resize it first)"));
    x = at::constant_pad_nd(x, {0, side - w, 0, side - h}, 0.0);
  }
  if (c.do_resize) x = owlv2_resize(x, c.height, c.width);
  if (c.do_normalize) {
    // tvF.normalize: image.sub_(mean).div_(std), float32 mean/std.
    const auto mean = at::tensor(std::vector<float>(c.image_mean.begin(), c.image_mean.end()))
                          .view({1, 3, 1, 1})
                          .to(x.device());
    const auto std_ = at::tensor(std::vector<float>(c.image_std.begin(), c.image_std.end()))
                          .view({1, 3, 1, 1})
                          .to(x.device());
    x = (x - mean) / std_;
  }
  return x.squeeze(0).contiguous();
}

}  // namespace libreyolo::image
