#include "models/core/pixel_mask.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace libreyolo::models::core {

at::Tensor checked_pixel_mask(const std::string& model_type, const at::Tensor& pixel_values,
                              const at::Tensor& pixel_mask, const at::Device& device) {
  const auto s = pixel_values.sizes();
  if (!pixel_mask.defined())
    return at::ones({s[0], s[2], s[3]}, pixel_values.options().dtype(at::kLong).device(device));
  if (pixel_mask.dim() != 3 || pixel_mask.size(0) != s[0] || pixel_mask.size(1) != s[2] ||
      pixel_mask.size(2) != s[3])
    throw std::invalid_argument(c10::str(model_type, ": pixel_mask must be (B, H, W) = (", s[0],
                                         ", ", s[2], ", ", s[3], "), got ", pixel_mask.sizes()));
  if (at::isFloatingType(pixel_mask.scalar_type()) || at::isComplexType(pixel_mask.scalar_type()))
    throw std::invalid_argument(c10::str(model_type,
                                         ": pixel_mask must be an integer or bool tensor, got ",
                                         pixel_mask.scalar_type()));
  return pixel_mask.to(device);
}

}  // namespace libreyolo::models::core
