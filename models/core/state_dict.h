// Strict loading of a safetensors checkpoint into a torch::nn::Module tree whose
// named_parameters()/named_buffers() are the on-disk (legacy Hugging Face) keys.
//
// How a family declares its tensors: build the module tree with register_module /
// register_parameter / register_buffer using the on-disk names (torch::nn::ModuleList gives
// the "0", "1", ... segments), so that "model.encoder.fpn_blocks.0.conv1.conv.weight" is the
// path of that parameter. Derived, non-persistent tensors (anchors, position embeddings) are
// NOT registered: compute them in forward() (or cache them in plain members).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/core/safetensors.h"

namespace libreyolo::models::core {

/// Exceptions to strictness, declared by each family (hf-models.md sections 1.3 and 10).
struct LoadRules {
  /// Other on-disk keys to try, in order, when a module key is not in the file (tied or
  /// aliased heads: "class_embed.1.weight" -> {"model.decoder.class_embed.1.weight",
  /// "class_embed.0.weight", ...}). Empty function = no aliases.
  std::function<std::vector<std::string>(const std::string& module_key)> aliases;
  /// ECMAScript regexes (std::regex_match on the whole key) of file keys that may stay unused,
  /// e.g. R"(model\.denoising_class_embed\.weight)". `.*\.num_batches_tracked` is always
  /// ignored and need not be listed.
  std::vector<std::string> ignored_file_keys;
  /// Regexes of module keys that may be absent from the file (they keep their constructed
  /// value; e.g. a buffer that old files do not carry).
  std::vector<std::string> optional_module_keys;
};

/// Summary of one load (for logs and tests).
struct LoadReport {
  size_t loaded = 0;                 ///< module tensors filled from the file
  std::vector<std::string> aliased;  ///< "module_key <- file_key" for alias hits
  std::vector<std::string> ignored;  ///< file keys left unused by a rule
};

/// Fills every parameter and buffer of `module` from `file`: floating-point tensors are converted
/// to `dtype` (float32/float16/bfloat16), integer ones keep the module's dtype; all go to
/// `device`; parameters get requires_grad(false). Strict: throws CheckpointError with ONE line
/// naming the file and listing every missing module key, every unexpected file key and every
/// shape mismatch ("shape mismatch for 'k': expected [a, b], found [c, d]"). Nothing is
/// modified when it throws.
LoadReport load_state_dict(torch::nn::Module& module, const SafetensorsFile& file,
                           const LoadRules& rules, at::ScalarType dtype, const at::Device& device);

/// "[a, b, c]" (messages).
std::string shape_string(at::IntArrayRef shape);

}  // namespace libreyolo::models::core
