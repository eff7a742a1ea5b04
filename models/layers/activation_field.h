// A config.json activation name read into layers::Activation, the error naming the field: what
// every family's config parser needs for its hidden_act / *_activation fields.
#pragma once

#include <string>

#include "models/core/config.h"
#include "models/layers/layers.h"

namespace libreyolo::models::layers {

/// activation_from_name of `v`'s string field `field` (`fallback` when absent). Throws
/// core::ConfigError naming the field for a name activation_from_name does not know.
Activation activation_field(const core::ConfigView& v, const std::string& field,
                            const std::string& fallback);

}  // namespace libreyolo::models::layers
