// The `hub` kernel provider: loads a kernels-hub build (Hugging Face kernels layout) pinned in
// kernels.lock, verified file by file, into this process and registers it as the `hub`
// implementation of its slot through the slot's HubBinding (kernels/hub/binding.h).
//
// LOCAL_KERNELS overrides a locked repository with a local build folder (huggingface/kernels
// load.py get_local_kernel: <path>/<variant>, <path>/build/<variant> or <path> itself), checked
// against its metadata.json `digest` when present, loaded without any request.
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

#include "kernels/hub/binding.h"
#include "kernels/hub/variant.h"
#include "kernels/policy.h"
#include "kernels/registry.h"

namespace libreyolo::kernels::hub {

/// The provider's name: what `hub_kernels: off` / LIBREYOLO_HUB_KERNELS=0 disable.
inline constexpr const char* kProviderName = "hub";

/// The provider's options (given at construction; the provider reads nothing else).
struct ProviderOptions {
  HubSettings settings;
  /// The slots' bindings; empty: builtin_bindings() (kernels/hub/binding.h).
  std::vector<HubBinding> bindings;
  /// Facts of the process; std::nullopt: detect_system().
  std::optional<SystemInfo> system;
  /// True while a CUDA graph is being captured on the current stream; empty: ask CUDA (always
  /// false in a build without the CUDA kernels).
  std::function<bool()> capturing;
  /// LOCAL_KERNELS ("org/repo=/path:org2/repo2=/path2", lock.h parse_local_kernels): those
  /// repositories of kernels.lock load from the local build folder instead of the Hub;
  /// std::nullopt: the process environment's LOCAL_KERNELS, read at load.
  std::optional<std::string> local_kernels;
};

/// A hub build this process loaded (process-wide, like the dlopen()ed libraries themselves).
struct LoadedBuild {
  std::string slot;
  std::string repo_id;
  std::string source;       ///< "hub" (pinned by kernels.lock) | "local" (LOCAL_KERNELS)
  std::string location;     ///< "org/name@sha build/<variant>" | the local variant folder
  std::string lock_format;  ///< "libreyolo" | "upstream" ("" for a local build)
};

/// Every hub build loaded so far in this process, in load order, each once (the server's
/// /active "hub_builds").
std::vector<LoadedBuild> loaded_builds();

/// LibTorch major.minor (TORCH_VERSION_MAJOR/MINOR) and C++ ABI, backend "cuda" with the CUDA
/// version LibTorch was built with and the current device's compute capability when a GPU is
/// usable (else "cpu"), CPU architecture and OS of this process.
SystemInfo detect_system();

/// True while the current CUDA stream is capturing a graph (false without CUDA).
bool cuda_graph_capturing();

/// The `hub` provider with these options.
std::shared_ptr<Provider> make_provider(ProviderOptions options);

}  // namespace libreyolo::kernels::hub
