// The `hub` kernel provider: loads a kernels-hub build (Hugging Face kernels layout) pinned in
// kernels.lock, verified file by file, into this process and registers it as the `hub`
// implementation of its slot (today: ms_deform_attn, ops of kernels-community/deformable-detr).
//
// Sequence at the loader (registry resolve, i.e. start-up or warm-up): read kernels.lock ->
// refuse unpinned/unlocked entries -> select a build variant for this process -> fetch
// build/<variant>/* into the HF-layout cache (or use the cache offline) -> verify every SHA-256
// (and metadata.json's `digest`) -> check metadata backend and archs -> dlopen -> find
// `<metadata.id>::ms_deform_attn_forward` in the c10 dispatcher and compare its schema -> register.
// The registered implementation then only calls the typed op handle.
// Any failure: one warning, one fallback event (Registry::record_event, or the registry's own
// disable on a call failure), nothing registered or the implementation disabled; the slot falls
// back. Nothing runs while a CUDA graph is being captured: the load is deferred to the first
// call outside a capture, and calls during a capture decline until then.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kernels/hub/variant.h"
#include "kernels/policy.h"
#include "kernels/registry.h"

namespace libreyolo::kernels::hub {

/// The provider's name: what `hub_kernels: off` / LIBREYOLO_HUB_KERNELS=0 disable.
inline constexpr const char* kProviderName = "hub";

/// Schemas the ms_deform_attn slot expects from a hub build (without the `<id>::` namespace),
/// as c10::FunctionSchema prints them (kernels-community/deformable-detr torch_binding.cpp).
inline constexpr const char* kForwardSchema =
    "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_loc, Tensor attn_weight, int im2col_step) -> Tensor";
inline constexpr const char* kBackwardSchema =
    "ms_deform_attn_backward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_loc, Tensor attn_weight, Tensor grad_output, int im2col_step) -> Tensor[]";

/// What the loader needs; produced when the loader runs (not when the provider is added).
struct ProviderOptions {
  HubSettings settings;
  /// Facts of the process; std::nullopt: detect_system().
  std::optional<SystemInfo> system;
  /// True while a CUDA graph is being captured on the current stream; empty: ask CUDA (always
  /// false in a build without the CUDA kernels).
  std::function<bool()> capturing;
};

/// LibTorch major.minor (TORCH_VERSION_MAJOR/MINOR) and C++ ABI, backend "cuda" with the CUDA
/// version LibTorch was built with and the current device's compute capability when a GPU is
/// usable (else "cpu"), CPU architecture and OS of this process.
SystemInfo detect_system();

/// True while the current CUDA stream is capturing a graph (false without CUDA).
bool cuda_graph_capturing();

/// The `hub` provider. `options` is called once, when the registry runs the loader.
Provider make_provider(std::function<ProviderOptions()> options);

/// Hub settings of the process registry's provider (Registry::global()). kernels::initialize()
/// stores the policy's settings here before its first resolve; until then the provider uses the
/// environment's (kernels.lock is then only found through an explicit lock file).
void set_process_settings(const HubSettings& settings);

/// The settings stored by set_process_settings, if any.
std::optional<HubSettings> process_settings();

}  // namespace libreyolo::kernels::hub
