#include "kernels/image/image_preprocess.h"

#include <cmath>

namespace libreyolo::kernels {

int resize_taps(int64_t in, int64_t out) {
  const float scale = resize_scale(in, out);
  const double support = scale >= 1.0 ? static_cast<double>(scale) : 1.0;
  return 1 + 2 * static_cast<int>(std::ceil(support));
}

const char* image_preprocess_decline_reason(const std::vector<at::Tensor>& images,
                                            const ImagePreprocessSpec& spec,
                                            const at::Tensor& out) {
  if (spec.owlv2) return kPreprocessOwlv2;
  if (spec.center_crop) return kPreprocessCenterCrop;
  if (spec.resample != 2) return kPreprocessNotBilinear;
  if (!spec.antialias) return kPreprocessNoAntialias;
  if (spec.native_uint8) return kPreprocessNativeUint8;
  const auto dtype = out.defined() ? out.scalar_type() : at::kByte;
  if (!out.defined() || !out.is_cuda() || out.dim() != 4 ||
      (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) ||
      !(out.is_contiguous() || out.is_contiguous(at::MemoryFormat::ChannelsLast)))
    return kPreprocessOutput;
  for (const auto& im : images) {
    if (!im.defined() || im.device() != out.device() || im.scalar_type() != at::kByte ||
        im.dim() != 3 || im.size(0) != 3 || !im.is_contiguous())
      return kPreprocessImage;
  }
  for (std::size_t i = 0; i < images.size() && i < spec.sizes.size(); ++i) {
    if (resize_taps(images[i].size(1), spec.sizes[i].first) > kMaxPreprocessTaps ||
        resize_taps(images[i].size(2), spec.sizes[i].second) > kMaxPreprocessTaps)
      return kPreprocessWide;
  }
  return nullptr;
}

}  // namespace libreyolo::kernels
