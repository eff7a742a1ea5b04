// serving.yaml `kernel_config:` in the Hugging Face KernelConfig spirit: which layout replaces
// which transformers class. No torch dependency (the daemon's configuration reader uses it).
//
//   kernel_config:
//     RTDetrConvNormLayer: batchnorm_fold      # a class name: every module of that class
//     RTDetrResNetConvLayer: off               # off: leave that class as loaded
//     ? [[RTDetrRepVggBlock, "model.encoder.fpn_blocks.*.bottlenecks.1"],
//        [RTDetrRepVggBlock, "model.encoder.fpn_blocks.*.bottlenecks.0"]]
//     : repvgg                                 # [class, path pattern] pairs (one parent)
//     ViTAttention: {layout: "owner/repo:FusedQKV", revision: main, trust_remote_code: true}
//
// A path pattern is a dotted module path where `*` matches exactly one segment; the patterns of
// one key must share one parent (everything but the last segment). Entries are matched in file
// order; the first entry that names a module's class (and path) decides for that module.
#pragma once

#include <string>
#include <vector>

#include "models/layouts/options.h"

namespace YAML {
class Node;
}

namespace libreyolo::models::layouts {

/// Parses a `kernel_config:` node read from `file`. Throws std::runtime_error
/// "FILE:LINE:COLUMN: kernel_config: ..." for: a node that is not a mapping, a key that is not
/// a class name or a list of [class_name, path_pattern] pairs, a class no layout replaces,
/// patterns without one common parent (naming the key and both paths), an unknown layout, a
/// layout that does not replace the key's class, a malformed hub reference or options.
std::vector<KernelConfigEntry> parse_kernel_config(const YAML::Node& node, const std::string& file);

/// The same from YAML text (tests); `file` names it in messages.
std::vector<KernelConfigEntry> parse_kernel_config_text(const std::string& yaml_text,
                                                        const std::string& file);

}  // namespace libreyolo::models::layouts
