// Start-up of the process registry: built-in references and providers, policy, one resolution.
#pragma once

#include <string>
#include <vector>

#include "kernels/policy.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {

/// Registers the references of every slot that has one (called once by Registry::global()).
void register_references(Registry& registry);

/// Adds the accelerated providers compiled into this build: "cuda" when built with CUDA,
/// "plugins" (LIBREYOLO_KERNEL_PLUGINS of `env`), and later "hub".
void add_builtin_providers(Registry& registry, const Environment& env);

/// dlopen()s every path of a ':'-separated list; each library registers its implementations
/// from static initialisers. A missing or broken library is logged (warning), recorded as a
/// fallback event (slot "*", impl "plugin:<path>") and skipped. Returns how many loaded.
int load_plugins(Registry& registry, const std::string& paths);

/// Applies `policy` to Registry::global(), resolves every slot once and logs the policy and the
/// resolved table. Call once at start-up, before serving.
void initialize(const Policy& policy);

/// The resolved table as text: per slot the selection and every candidate with eligibility,
/// reason and counters (the CLI's and the start-up log's format).
std::string format_table(const std::vector<SlotReport>& report);

/// True when the ms_deform_attn / fake_quant_fp8 CUDA kernels are compiled into this build.
bool built_with_cuda();

}  // namespace libreyolo::kernels
