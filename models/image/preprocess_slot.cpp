#include "models/image/preprocess_slot.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace libreyolo::image {
namespace {

/// True when every image is what ImageProcessor::preprocess accepts: a non-empty (3, h, w)
/// uint8 tensor. Anything else goes to the portable path, which throws its own message.
bool well_formed(const std::vector<at::Tensor>& images) {
  if (images.empty()) return false;
  for (const auto& im : images)
    if (!im.defined() || im.dim() != 3 || im.size(0) != 3 || im.scalar_type() != at::kByte ||
        im.size(1) == 0 || im.size(2) == 0)
      return false;
  return true;
}

/// The (H, W) of the batch: the largest output size (ImageProcessor::preprocess pads to it).
std::pair<int64_t, int64_t> batch_size_of(const kernels::ImagePreprocessSpec& spec) {
  int64_t h = 0, w = 0;
  for (const auto& [sh, sw] : spec.sizes) {
    h = std::max(h, sh);
    w = std::max(w, sw);
  }
  return {h, w};
}

/// processor.preprocess(images).pixel_values into `out`'s top-left, zeros elsewhere.
void portable_into(const ImageProcessor& processor, const std::vector<at::Tensor>& images,
                   const at::Tensor& out) {
  const at::Tensor values = processor.preprocess(images).pixel_values;
  if (values.size(2) != out.size(2) || values.size(3) != out.size(3)) out.zero_();
  out.narrow(2, 0, values.size(2)).narrow(3, 0, values.size(3)).copy_(values);
}

}  // namespace

kernels::ImagePreprocessSpec preprocess_spec(const ImageProcessor& processor,
                                             const std::vector<at::Tensor>& images) {
  const ProcessorConfig& c = processor.config();
  kernels::ImagePreprocessSpec spec;
  for (const auto& im : images) spec.sizes.push_back(processor.output_size(im.size(1), im.size(2)));
  spec.resample = c.resample;
  spec.antialias = c.antialias;
  spec.native_uint8 = c.uint8_resize == ProcessorConfig::Uint8Resize::native_uint8;
  spec.center_crop = c.do_center_crop;
  spec.rescale_before_resize = rescale_before_resize(c);
  spec.owlv2 = c.owlv2;
  if (spec.rescale_before_resize) {
    // rescale_resize_normalize's order (processor.cpp): the rescale before the resize, then
    // tvF.normalize with the unscaled mean and std.
    spec.rescale_factor = c.do_rescale ? static_cast<float>(c.rescale_factor) : 1.0f;
    spec.values = c.do_normalize ? kernels::ImagePreprocessSpec::Values::normalize
                                 : kernels::ImagePreprocessSpec::Values::raw;
    spec.mean = c.image_mean;
    spec.std = c.image_std;
  } else if (c.do_normalize) {
    spec.values = kernels::ImagePreprocessSpec::Values::normalize;
    std::tie(spec.mean_scaled, spec.std_scaled) = fused_mean_std(c);
  } else if (c.do_rescale) {
    spec.values = kernels::ImagePreprocessSpec::Values::rescale;
    spec.rescale_factor = static_cast<float>(c.rescale_factor);
  } else {
    spec.values = kernels::ImagePreprocessSpec::Values::raw;
  }
  return spec;
}

void preprocess_into(const kernels::ImagePreprocessHandle& handle, const ImageProcessor& processor,
                     const std::vector<at::Tensor>& images, const at::Tensor& out) {
  if (!out.defined() || out.dim() != 4 || out.size(0) != static_cast<int64_t>(images.size()) ||
      out.size(1) != 3)
    throw std::invalid_argument(
        c10::str("preprocess_into: the output must be (", images.size(), ", 3, H, W), got ",
                 out.defined() ? c10::str(out.sizes()) : std::string("an undefined tensor")));
  // The OWLv2 pipeline pads to a square before its resize: its sizes are not output_size's.
  if (!well_formed(images) || processor.config().owlv2)
    return portable_into(processor, images, out);
  const kernels::ImagePreprocessSpec spec = preprocess_spec(processor, images);
  for (std::size_t i = 0; i < images.size(); ++i) {
    const auto [h, w] = spec.sizes[i];
    if (h > out.size(2) || w > out.size(3))
      throw std::invalid_argument(c10::str("preprocess_into: image ", i, " processes to ", h, "x",
                                           w, ", larger than the output's ", out.size(2), "x",
                                           out.size(3)));
    // Without do_pad the portable path throws its own message for different sizes.
    if (!processor.config().do_pad && spec.sizes[i] != spec.sizes[0])
      return portable_into(processor, images, out);
  }
  if (!handle.empty() && handle(images, spec, out)) return;
  portable_into(processor, images, out);
}

ProcessorOutput preprocess(const kernels::ImagePreprocessHandle& handle,
                           const ImageProcessor& processor, const std::vector<at::Tensor>& images,
                           at::ScalarType dtype, at::MemoryFormat format) {
  if (!well_formed(images) || processor.config().owlv2) {
    ProcessorOutput out = processor.preprocess(images);  // throws for a malformed batch
    out.pixel_values = out.pixel_values.to(dtype).contiguous(format);
    return out;
  }
  const kernels::ImagePreprocessSpec spec = preprocess_spec(processor, images);
  const auto [h, w] = batch_size_of(spec);
  const auto b = static_cast<int64_t>(images.size());
  const auto on = at::TensorOptions().device(images[0].device());
  ProcessorOutput out;
  out.pixel_values = at::empty({b, 3, h, w}, on.dtype(dtype).memory_format(format));
  preprocess_into(handle, processor, images, out.pixel_values);
  for (const auto& im : images) out.original_sizes.emplace_back(im.size(1), im.size(2));
  if (processor.config().do_pad) {  // as ImageProcessor::preprocess makes it
    out.pixel_mask = at::zeros({b, h, w}, on.dtype(at::kLong));
    for (int64_t i = 0; i < b; ++i)
      out.pixel_mask[i]
          .narrow(0, 0, spec.sizes[i].first)
          .narrow(1, 0, spec.sizes[i].second)
          .fill_(1);
  }
  return out;
}

}  // namespace libreyolo::image
