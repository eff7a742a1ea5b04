// The kernel policy: the `kernels:` section of the server configuration, overridden by the
// environment, with the source of every value recorded (DESIGN.md "Policy: YAML, then
// environment"). It produces the registry's Filter.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/registry.h"

namespace YAML {
class Node;
}

namespace libreyolo::kernels {

/// Where an effective value came from.
enum class Source { default_value, file, environment, flag };
/// "default" | "file" | "environment" | "flag" (a command-line flag of the daemon).
const char* source_name(Source source);

/// A policy value and its origin ("server.yaml:12:3", "LIBREYOLO_KERNELS", "").
template <class T>
struct Setting {
  T value{};
  Source source = Source::default_value;
  std::string origin;
};

/// Per-module choice between SDPA and the manual attention math.
enum class FusedAttention { family_default, on, off };
/// "default" | "on" | "off".
const char* fused_attention_name(FusedAttention value);

/// Whether the built-in layouts (KernelConfig, models/layouts/) apply: `default` applies each
/// layout where it is on by default for the family (the parity gate decided), `on` applies every
/// layout whose predicate holds, `off` none (byte-identical to the unlayouted modules).
enum class LayoutMode { family_default, on, off };
/// "default" | "on" | "off".
const char* layout_mode_name(LayoutMode value);

/// Settings of the hub provider (`kernels.hub`); see the hub-kernels issue.
struct HubSettings {
  Setting<std::string> endpoint{"https://huggingface.co"};
  Setting<std::string> cache_dir;  ///< empty: KERNELS_CACHE, else HF_HUB_CACHE, else ~/.cache
  Setting<bool> offline{false};
  Setting<std::string> lock_file;  ///< empty: kernels.lock next to the config file
  Setting<double> timeout_seconds{30.0};
  // Added for the hub provider (kernels/hub/); no YAML keys of their own.
  /// Attempts per HTTP request after the first one, with exponential backoff (kernels/hub/http.h).
  int retries = 3;
  /// Bearer token for the endpoint, from HF_TOKEN (environment only; never logged).
  std::string token;
  /// Where the cache is when cache_dir is empty and neither KERNELS_CACHE nor HF_HUB_CACHE is
  /// set: $HF_HOME/hub, else $HOME/.cache/huggingface/hub (huggingface_hub's default), read from
  /// the environment with the rest of the policy.
  std::string fallback_cache_dir = "/tmp/.cache/huggingface/hub";
  /// The configuration file the policy was read from ("" = environment only): the default
  /// kernels.lock lives next to it.
  std::string config_file;
};

/// The effective policy.
struct Policy {
  /// "auto" | "off" | "reference" | an implementation name (lower case).
  Setting<std::string> selection{"auto"};
  /// True when `selection` came from LIBREYOLO_QUANT_KERNELS (legacy alias).
  bool selection_from_legacy_alias = false;
  Setting<bool> hub_kernels{true};
  Setting<FusedAttention> fused_attention{FusedAttention::family_default};
  /// `kernels.layouts` / LIBREYOLO_LAYOUTS (environment wins).
  Setting<LayoutMode> layouts{LayoutMode::family_default};
  /// Per slot: allowed implementation names (`slots: {ms_deform_attn: {allow: [cuda, hub]}}`).
  std::map<std::string, Setting<std::vector<std::string>>> slot_allow;
  HubSettings hub;
  /// LIBREYOLO_KERNEL_PLUGINS: ':'-separated shared libraries for the `plugins` provider
  /// (environment only).
  Setting<std::string> plugins;

  /// The registry filter this policy means.
  Filter filter() const;
  /// Multi-line human-readable table: key, value, source.
  std::string describe() const;
};

/// Environment variables as read once at start-up (name -> value). Only passed around, never
/// read implicitly below the programs' main() (process_environment() is their one reader), so
/// tests can give any environment.
using Environment = std::map<std::string, std::string>;

/// The LIBREYOLO_*, HF_* and KERNELS_* variables of this process. Called by main() only.
Environment process_environment();

/// A policy error; what() is "FILE:LINE:COLUMN: message" when the value came from a file.
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `text` with every control character (below 0x20, and 0x7F) written as \xNN: yaml-cpp quotes
/// the offending character of a parse error raw ("unknown escape character: " + a newline), and
/// configuration errors are one line (server_yaml_fuzz,
/// tests/fuzz/corpus/server_yaml/regress-escape-newline.yaml).
std::string printable(const std::string& text);

/// "FILE:LINE:COLUMN" (1-based) of a YAML node, or FILE when the node has no position: the
/// prefix of every configuration error (policy, server config, serving.yaml).
std::string yaml_location(const std::string& file, const YAML::Node& node);

/// Trimmed, lower-cased copy (the normalisation applied to every environment value).
std::string normalize(const std::string& value);

/// True for "0", "false", "off", "no" after normalize().
bool is_falsy(const std::string& value);
/// True for "1", "true", "on", "yes" after normalize().
bool is_truthy(const std::string& value);

/// Policy from the defaults and the environment only. Throws PolicyError naming the variable
/// for a value it cannot mean (LIBREYOLO_HUB_KERNELS=maybe, LIBREYOLO_LAYOUTS=sometimes).
Policy policy_from_environment(const Environment& env);

/// Checks the names a policy uses against what `registry` declares and provides (after its
/// providers loaded): every `slots:` key is a declared slot, every `allow:` entry and a
/// `selection` name is a known implementation (Registry::known_names). Throws PolicyError
/// prefixed with the value's origin ("FILE:LINE:COLUMN" or the variable's name), listing the
/// known names. A typo never silently leaves only references.
void check_names(const Policy& policy, const Registry& registry);

/// The same check for one model's per-slot lists (serving.yaml `kernels.slots`).
void check_names(const std::map<std::string, Setting<std::vector<std::string>>>& slot_allow,
                 const Registry& registry);

/// Policy from a `kernels:` YAML mapping (may be a null node: all defaults) read from `file`,
/// then the environment. Throws PolicyError naming file, line and column for unknown keys,
/// wrong types and unknown slots.
Policy parse_policy(const YAML::Node& kernels, const std::string& file, const Environment& env);

/// A model's own kernel settings: serving.yaml `kernels: {slots: {...}, layouts: ...}`.
struct ModelKernelPolicy {
  /// Per slot: allowed names, replacing the server's list for that slot.
  std::map<std::string, Setting<std::vector<std::string>>> slot_allow;
  /// Overrides the server's kernels.layouts for this model when set.
  std::optional<Setting<LayoutMode>> layouts;
  /// slot_allow without the sources (what Filter::overridden takes).
  SlotAllow allow() const;
};

/// Parses a serving.yaml `kernels:` mapping (null: nothing set). Throws PolicyError naming
/// FILE:LINE:COLUMN for unknown keys and wrong types (names are check_names()'s).
ModelKernelPolicy parse_model_kernels(const YAML::Node& kernels, const std::string& file);

/// Reads `file` (a whole server configuration) and parses its `kernels:` section.
Policy load_policy_file(const std::string& file, const Environment& env);

}  // namespace libreyolo::kernels
