// What a caller asks of the layouts (KernelConfig, models/layouts/layouts.h) and what they did.
// No torch dependency: the server's configuration parser and reports use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/policy.h"

namespace libreyolo::models::layouts {

/// One target of a `kernel_config:` key: a transformers class name and an optional module path
/// pattern (dot-separated, `*` matches exactly one segment; empty: every path).
struct KernelConfigTarget {
  std::string class_name;
  std::string path_pattern;
};

/// One `kernel_config:` entry of serving.yaml (parse_kernel_config, kernel_config.h).
struct KernelConfigEntry {
  std::string key;  ///< the key as written ("RTDetrConvNormLayer", "[[A, model.x.*], ...]")
  std::vector<KernelConfigTarget> targets;
  /// A built-in layout name, "off", or a hub reference "owner/repo:ClassName".
  std::string value;
  std::string version, revision;  ///< hub references only (one of them)
  bool trust_remote_code = false;
  std::string origin;  ///< "serving.yaml:12:3" ("" when not from a file)

  /// True for "owner/repo:ClassName" values.
  bool is_hub() const { return value.find('/') != std::string::npos; }
};

/// How load_model applies layouts.
struct LayoutOptions {
  /// default: the layouts that are on by default for the family (DESIGN.md "Layouts"); on:
  /// every layout whose predicate holds; off: none (the modules exactly as loaded).
  kernels::Setting<kernels::LayoutMode> mode{kernels::LayoutMode::family_default};
  /// Per-class choices; win over `mode` except `off`, which disables every layout.
  std::vector<KernelConfigEntry> kernel_config;
};

/// What one layout did to one model, for Model::layouts(), /active and the tools' reports.
struct LayoutReport {
  std::string layout;  ///< "batchnorm_fold", "repvgg", "qkv_concat", "channels_last"
  /// Why it applied: "default (rt_detr)", "kernels.layouts: on (LIBREYOLO_LAYOUTS)",
  /// "kernel_config: RTDetrConvNormLayer (serving.yaml:12:3)".
  std::string source;
  std::vector<std::string> classes;  ///< transformers classes it replaced, sorted
  int64_t modules = 0;               ///< modules replaced
  /// Elements of the replaced modules' parameters and buffers before and after.
  int64_t params_before = 0, params_after = 0;
};

/// One line per report: "batchnorm_fold: 57 modules (RTDetrConvNormLayer, ...), parameters
/// 123456 -> 120000, source default (rt_detr)"; "layouts: none applied" when empty.
std::string describe(const std::vector<LayoutReport>& reports);

}  // namespace libreyolo::models::layouts
