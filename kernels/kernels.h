// Start-up of the process registry: built-in slots and references, the providers, the policy,
// one resolution.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/policy.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {

/// Declares every built-in slot (ms_deform_attn, sampling_locations, refine_boxes,
/// rotary_embedding, fake_quant_fp8, attention, conv2d_bias_act, max_pool2d, add_layer_norm,
/// linear_act, linear, fp8_gemm, image_decode, image_decode_batch, image_preprocess) and registers
/// the references of those that have one here (image_decode's is libreyolo_models':
/// models/image/decode_slot.h). Called once for Registry::process_default(); tests call it on their
/// own registries.
void register_builtin_slots(Registry& registry);

/// The in-tree CUDA kernels as a provider ("cuda"), or null in a build without them. The
/// provider is unavailable (not loaded) when no CUDA device is usable.
std::shared_ptr<Provider> make_cuda_provider();

/// The `plugins` provider: dlopen()s every path of a ':'-separated list and calls each library's
/// `extern "C" void libreyolo_register_kernels(libreyolo::kernels::Registry&)` with the registry
/// that loads it (the plugin ABI; tests/plugin/test_plugin.cpp is an example). A missing or
/// broken library, or one without that function, is logged (warning), recorded as a fallback
/// event (slot "*", impl "plugin:<path>") and skipped.
std::shared_ptr<Provider> make_plugins_provider(std::string paths);

/// What initialize() applies to a registry: the policy's filter, the providers the policy asks
/// for (plugins, hub with the policy's settings) unless present, one resolution, and the name
/// check (check_names). Throws PolicyError for a name nothing declares or provides.
void apply_policy(Registry& registry, const Policy& policy);

/// apply_policy(Registry::process_default(), policy), then logs the policy and the resolved
/// table. Call once at start-up, before loading models.
void initialize(const Policy& policy);

/// The resolved table as text: per slot the selection and every candidate with eligibility,
/// reason and counters (the CLI's and the start-up log's format).
std::string format_table(const std::vector<SlotReport>& report);

/// True when the ms_deform_attn / fake_quant_fp8 CUDA kernels are compiled into this build.
bool built_with_cuda();

}  // namespace libreyolo::kernels
