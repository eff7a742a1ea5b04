#include "models/layers/activation_field.h"

#include <stdexcept>

namespace libreyolo::models::layers {

Activation activation_field(const core::ConfigView& v, const std::string& field,
                            const std::string& fallback) {
  try {
    return activation_from_name(v.get_string(field, fallback));
  } catch (const std::invalid_argument& e) {
    v.fail(field, e.what());
  }
}

}  // namespace libreyolo::models::layers
