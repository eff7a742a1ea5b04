#include "models/model.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace libreyolo::models {

void check_pixel_values(const std::string& model_type, const at::Tensor& pixel_values,
                        int64_t channels, int64_t min_size, int64_t multiple) {
  const bool shape_ok = pixel_values.defined() && pixel_values.dim() == 4 &&
                        pixel_values.size(0) >= 1 && pixel_values.size(1) == channels &&
                        pixel_values.size(2) >= min_size && pixel_values.size(3) >= min_size &&
                        pixel_values.size(2) % multiple == 0 &&
                        pixel_values.size(3) % multiple == 0;
  if (!shape_ok) {
    throw std::invalid_argument(c10::str(
        model_type, ": pixel_values must be (B, ", channels, ", H, W) with B >= 1 and H, W >= ",
        min_size, multiple > 1 ? c10::str(" and multiples of ", multiple) : std::string(), ", got ",
        pixel_values.defined() ? pixel_values.sizes() : at::IntArrayRef{}));
  }
  const auto t = pixel_values.scalar_type();
  if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16) {
    throw std::invalid_argument(
        c10::str(model_type, ": pixel_values must be float32, float16 or bfloat16, got ", t));
  }
}

}  // namespace libreyolo::models
