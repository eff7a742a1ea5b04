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

/// upsample_bilinear2d's taps along one axis (align_corners=False, no scale given; aten/src/ATen/
/// native/UpSample.h area_pixel_compute_source_index, guard_index_and_lambda): for each of `out`
/// outputs the two source indices and their float32 weights.
struct BilinearTaps {
  std::vector<int64_t> i0, i1;
  std::vector<float> l0, l1;
};
BilinearTaps bilinear_taps(int64_t in, int64_t out) {
  BilinearTaps t;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    const float real = std::max(scale * (static_cast<float>(d) + 0.5f) - 0.5f, 0.0f);
    const int64_t index = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
    const float lambda = std::min(std::max(real - static_cast<float>(index), 0.0f), 1.0f);
    t.i0.push_back(index);
    t.i1.push_back(index + (index < in - 1 ? 1 : 0));
    t.l0.push_back(1.0f - lambda);
    t.l1.push_back(lambda);
  }
  return t;
}

/// The sorted distinct source indices a BilinearTaps reads (`indices`), and where each tap's
/// index lies among them (`at0`, `at1`, one per output).
struct UsedIndices {
  at::Tensor indices, at0, at1;
};
UsedIndices used_indices(const BilinearTaps& taps, const at::Device& device) {
  std::vector<int64_t> all(taps.i0);
  all.insert(all.end(), taps.i1.begin(), taps.i1.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  auto position = [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> pos;
    for (auto v : idx) pos.push_back(std::lower_bound(all.begin(), all.end(), v) - all.begin());
    return at::tensor(pos).to(device);
  };
  return {at::tensor(all).to(device), position(taps.i0), position(taps.i1)};
}

/// sum_t w[t] * x.index_select(dim, index + t): a 1-D convolution of x's padded axis `dim`
/// evaluated at `index` only.
at::Tensor blur_at(const at::Tensor& x, int64_t dim, const at::Tensor& index, const at::Tensor& w) {
  at::Tensor sum;
  for (int64_t t = 0; t < w.size(0); ++t) {
    auto term = x.index_select(dim, index + t) * w[t];
    sum = sum.defined() ? sum + term : term;
  }
  return sum;
}

/// Owlv2ImageProcessor.resize of x (1, 3, S, S') float32 to (height, width).
at::Tensor owlv2_resize(const at::Tensor& x, int64_t height, int64_t width) {
  // factors = tensor(input_shape[2:]) / tensor(output_shape): int64 / int64 -> float32.
  const auto in = at::tensor(std::vector<int64_t>{x.size(2), x.size(3)});
  const auto out = at::tensor(std::vector<int64_t>{height, width});
  const auto sigma = ((in / out - 1) / 2).clamp_min(0);
  // TorchvisionBackend.resize(antialias=False), BILINEAR (the resample argument is not passed on).
  if (sigma.eq(0).any().item<bool>())
    return at::upsample_bilinear2d(x, {height, width}, /*align_corners=*/false);
  const auto ks = (2 * at::ceil(3 * sigma).to(at::kInt) + 1).to(at::kLong);
  // gaussian_blur(image, (k[0], k[1]), sigma=[s[0], s[1]]): index 0 is the x direction there.
  const int64_t kx = ks[0].item<int64_t>(), ky = ks[1].item<int64_t>();
  const double sx = sigma[0].item<double>(), sy = sigma[1].item<double>();
  // torchvision blurs the whole image with the 2-D kernel outer(ky, kx) (reflect padding), then
  // the bilinear resize reads at most two rows and two columns per output. Here the same kernel
  // runs as a vertical then a horizontal 1-D sum, evaluated only at the rows and columns the
  // resize reads, and the resize is upsample_bilinear2d's arithmetic on those: a 6000 x 6000
  // photograph for 960 x 960 blurs 1,920 x 1,920 points instead of 36 M, each with ky + kx
  // multiply-adds instead of ky * kx (the 2-D form on the whole image held a preprocessing thread
  // for minutes). The sums differ from torchvision's by float32 rounding only (OwlParity
  // pixel_values bar 1e-5).
  const auto wy = gaussian_kernel1d(ky, sy, x.device());
  const auto wx = gaussian_kernel1d(kx, sx, x.device());
  const auto padded = at::reflection_pad2d(x, {kx / 2, kx / 2, ky / 2, ky / 2});
  const auto ty = bilinear_taps(x.size(2), height), tx = bilinear_taps(x.size(3), width);
  const auto device = x.device();
  const auto rows = used_indices(ty, device), cols = used_indices(tx, device);
  // (1, 3, rows, cols): the blurred image at the points the resize reads.
  const auto blurred = blur_at(blur_at(padded, 2, rows.indices, wy), 3, cols.indices, wx);
  auto weights = [&](const std::vector<float>& l, at::IntArrayRef shape) {
    return at::tensor(l).to(device).view(shape);
  };
  const auto y0 = blurred.index_select(2, rows.at0), y1 = blurred.index_select(2, rows.at1);
  const auto &x0 = cols.at0, &x1 = cols.at1;
  const auto lx0 = weights(tx.l0, {1, 1, 1, width}), lx1 = weights(tx.l1, {1, 1, 1, width});
  const auto ly0 = weights(ty.l0, {1, 1, height, 1}), ly1 = weights(ty.l1, {1, 1, height, 1});
  // upsample_bilinear2d: h0lambda * (w0lambda * x00 + w1lambda * x01) + h1lambda * (...).
  return ly0 * (lx0 * y0.index_select(3, x0) + lx1 * y0.index_select(3, x1)) +
         ly1 * (lx0 * y1.index_select(3, x0) + lx1 * y1.index_select(3, x1));
}

}  // namespace

at::Tensor owlv2_pixel_values(const ProcessorConfig& c, const at::Tensor& image) {
  const at::Tensor image_u8 = image.contiguous();  // planes (to_chw_tensor's view is interleaved)
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
