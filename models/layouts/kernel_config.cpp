#include "models/layouts/kernel_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <regex>
#include <stdexcept>

#include "kernels/policy.h"
#include "models/layouts/catalog.h"

namespace libreyolo::models::layouts {
namespace {

[[noreturn]] void fail(const std::string& file, const YAML::Node& node, const std::string& msg) {
  throw std::runtime_error(kernels::yaml_location(file, node) +
                           ": kernel_config: " + kernels::printable(msg));
}

/// User text echoed in a message, clipped (a huge scalar must not become a huge reason).
std::string clip(const std::string& s, size_t max = 80) {
  return s.size() <= max ? s : s.substr(0, max - 3) + "...";
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::vector<std::string> known_classes() {
  std::vector<std::string> out;
  for (const auto& l : layout_catalog())
    for (const auto& c : l.replaces)
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

std::string parent(const std::string& pattern) {
  const auto dot = pattern.rfind('.');
  return dot == std::string::npos ? "" : pattern.substr(0, dot);
}

std::string scalar(const std::string& file, const YAML::Node& n, const std::string& what) {
  if (!n.IsScalar()) fail(file, n, what);
  return n.Scalar();
}

/// The key: a class name, or [[class, pattern], ...] (one parent).
void parse_key(const std::string& file, const YAML::Node& key, KernelConfigEntry& e) {
  const auto classes = known_classes();
  auto check_class = [&](const YAML::Node& n, const std::string& c) {
    if (std::find(classes.begin(), classes.end(), c) == classes.end())
      fail(file, n,
           "unknown class '" + clip(c) + "' (no layout replaces it; known: " + join(classes) + ")");
  };
  if (key.IsScalar()) {
    e.key = key.Scalar();
    check_class(key, e.key);
    e.targets.push_back({e.key, ""});
    return;
  }
  const char* shape = "a key must be a class name or a list of [class_name, path_pattern] pairs";
  if (!key.IsSequence() || key.size() == 0) fail(file, key, shape);
  for (const auto& pair : key) {
    if (!pair.IsSequence() || pair.size() != 2 || !pair[0].IsScalar() || !pair[1].IsScalar())
      fail(file, pair, shape);
    const std::string cls = pair[0].Scalar(), pattern = pair[1].Scalar();
    check_class(pair[0], cls);
    if (pattern.empty()) fail(file, pair[1], "empty path pattern for class " + cls);
    e.targets.push_back({cls, pattern});
  }
  e.key = "[";
  for (size_t i = 0; i < e.targets.size(); ++i)
    e.key += (i ? ", [" : "[") + e.targets[i].class_name + ", " + e.targets[i].path_pattern + "]";
  e.key += "]";
  for (size_t i = 1; i < e.targets.size(); ++i) {
    const auto& a = e.targets[0].path_pattern;
    const auto& b = e.targets[i].path_pattern;
    if (parent(a) != parent(b))
      fail(file, key[i],
           "key " + clip(e.key, 400) + ": path patterns '" + clip(a, 160) + "' and '" +
               clip(b, 160) + "' do not share one parent");
  }
}

/// The value: a layout name, off, or a hub reference (scalar or {layout, version|revision,
/// trust_remote_code}).
void parse_value(const std::string& file, const YAML::Node& v, KernelConfigEntry& e) {
  // yaml-cpp's Node::operator= assigns the referenced node's content: bind with reset().
  YAML::Node layout;
  bool has_layout = false;
  if (v.IsMap()) {
    for (const auto& kv : v) {
      const std::string k = scalar(file, kv.first, "option names must be strings");
      if (k == "layout") {
        layout.reset(kv.second);
        has_layout = true;
      } else if (k == "version" || k == "revision") {
        const std::string s = scalar(file, kv.second, e.key + ": " + k + " must be a string");
        (k == "version" ? e.version : e.revision) = s;
      } else if (k == "trust_remote_code") {
        try {
          e.trust_remote_code = kv.second.as<bool>();
        } catch (const YAML::Exception&) {
          fail(file, kv.second, e.key + ": trust_remote_code must be true or false");
        }
      } else {
        fail(file, kv.first,
             e.key + ": unknown option '" + clip(k) +
                 "' (expected layout, version, revision, trust_remote_code)");
      }
    }
    if (!has_layout) fail(file, v, e.key + ": missing 'layout'");
    if (!e.version.empty() && !e.revision.empty())
      fail(file, v, e.key + ": give version or revision, not both");
  } else {
    layout.reset(v);
  }
  e.value = scalar(file, layout,
                   e.key + ": the value must be a layout name, off, or owner/repo:ClassName");
  std::vector<std::string> names{"off"};
  for (const auto& l : layout_catalog()) names.push_back(l.name);
  if (e.value.find('/') != std::string::npos) {
    // Bounded before std::regex: libstdc++'s matcher recurses once per character, and a
    // 100,000-character value overflowed the stack (serving_yaml_fuzz,
    // tests/fuzz/corpus/serving_yaml/regress-long-hub-reference.yaml).
    if (e.value.size() > 512)
      fail(file, layout,
           e.key + ": hub reference '" + clip(e.value) + "' must be owner/repo:ClassName (" +
               std::to_string(e.value.size()) + " characters, at most 512)");
    static const std::regex hub(
        "^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*:"
        "[A-Za-z_][A-Za-z0-9_]*$");
    if (!std::regex_match(e.value, hub))
      fail(file, layout,
           e.key + ": hub reference '" + clip(e.value) + "' must be owner/repo:ClassName");
    return;
  }
  if (v.IsMap() && (!e.version.empty() || !e.revision.empty() || e.trust_remote_code))
    fail(file, v, e.key + ": version, revision and trust_remote_code apply to hub references only");
  const auto* info = find_layout_info(e.value);
  if (e.value != "off" && !info)
    fail(file, layout,
         e.key + ": unknown layout '" + clip(e.value) + "' (expected " + join(names) +
             ", or owner/repo:ClassName)");
  if (!info) return;
  for (const auto& t : e.targets)
    if (std::find(info->replaces.begin(), info->replaces.end(), t.class_name) ==
        info->replaces.end())
      fail(file, layout,
           e.key + ": layout " + e.value + " does not replace " + t.class_name + " (it replaces " +
               join(info->replaces) + ")");
}

}  // namespace

std::vector<KernelConfigEntry> parse_kernel_config(const YAML::Node& node,
                                                   const std::string& file) {
  std::vector<KernelConfigEntry> out;
  if (!node.IsDefined() || node.IsNull()) return out;
  if (!node.IsMap())
    fail(file, node, "must be a mapping of class names (or [class, path] pairs) to layouts");
  for (const auto& kv : node) {
    KernelConfigEntry e;
    parse_key(file, kv.first, e);
    parse_value(file, kv.second, e);
    e.origin = kernels::yaml_location(file, kv.first);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<KernelConfigEntry> parse_kernel_config_text(const std::string& yaml_text,
                                                        const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& ex) {
    throw std::runtime_error(file + ": kernel_config: " + kernels::printable(ex.what()));
  }
  return parse_kernel_config(root, file);
}

}  // namespace libreyolo::models::layouts
