#include "kernels/policy.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>

extern char** environ;

namespace libreyolo::kernels {
namespace {

std::string where(const std::string& file, const YAML::Node& node) {
  return yaml_location(file, node);
}

[[noreturn]] void fail(const std::string& file, const YAML::Node& node, const std::string& msg) {
  throw PolicyError(where(file, node) + ": " + printable(msg));
}

std::string scalar(const std::string& file, const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) fail(file, node, "kernels." + key + " must be a string");
  return node.Scalar();
}

// YAML 1.1 booleans (what `hub_kernels: off` means to most YAML readers) and their strings.
bool boolean(const std::string& file, const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) fail(file, node, key + " must be a boolean (on/off, true/false)");
  const std::string v = normalize(node.Scalar());
  if (v == "on" || v == "true" || v == "yes" || v == "y" || v == "1") return true;
  if (v == "off" || v == "false" || v == "no" || v == "n" || v == "0") return false;
  fail(file, node, key + " must be a boolean (on/off, true/false), got '" + node.Scalar() + "'");
}

void parse_hub(const YAML::Node& hub, const std::string& file, HubSettings& out) {
  if (hub.IsNull()) return;
  if (!hub.IsMap()) fail(file, hub, "kernels.hub must be a mapping");
  for (const auto& kv : hub) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    auto set_string = [&](Setting<std::string>& s) {
      s = {scalar(file, v, "hub." + key), Source::file, where(file, v)};
    };
    // A relative path is relative to the configuration file's folder (as the default
    // kernels.lock next to it, and model_repository: server/config/config.h path_from_file).
    auto set_path = [&](Setting<std::string>& s) {
      set_string(s);
      namespace fs = std::filesystem;
      if (file.empty() || s.value.empty() || fs::path(s.value).is_absolute()) return;
      fs::path dir = fs::path(file).parent_path();
      if (dir.empty()) dir = ".";
      s.value = fs::absolute(dir / s.value).lexically_normal().string();
    };
    if (key == "endpoint") {
      set_string(out.endpoint);
    } else if (key == "cache_dir") {
      set_path(out.cache_dir);
    } else if (key == "lock_file") {
      set_path(out.lock_file);
    } else if (key == "offline") {
      out.offline = {boolean(file, v, "kernels.hub.offline"), Source::file, where(file, v)};
    } else if (key == "timeout_seconds") {
      double t = 0;
      try {
        t = v.as<double>();
      } catch (const YAML::Exception&) {
        fail(file, v, "kernels.hub.timeout_seconds must be a number");
      }
      if (!(t > 0)) fail(file, v, "kernels.hub.timeout_seconds must be > 0");
      out.timeout_seconds = {t, Source::file, where(file, v)};
    } else {
      fail(file, kv.first,
           "unknown key kernels.hub." + key +
               " (expected endpoint, cache_dir, offline, lock_file, timeout_seconds)");
    }
  }
}

// default | on | off (YAML 1.1 reads bare on/off as booleans; both spellings mean the same).
std::optional<int> tri_state(const std::string& raw) {
  const std::string s = normalize(raw);
  if (s == "default") return 0;
  if (s == "on" || s == "true") return 1;
  if (s == "off" || s == "false") return 2;
  return std::nullopt;
}

// `slots: {<slot>: {allow: [names]}}` (whether each slot exists is check_names()'s question:
// the registry declares slots).
/// Slot and implementation names are printable ASCII without spaces (every declared name is):
/// anything else is refused here, so that messages and --print-config (which writes slot names
/// as YAML keys) print them as they are and read back (server_yaml_fuzz,
/// tests/fuzz/corpus/server_yaml/regress-slot-name-bytes.yaml).
void check_name(const std::string& file, const YAML::Node& node, const std::string& name,
                const char* what) {
  bool ok = !name.empty() && name.size() <= 128;
  for (unsigned char c : name) ok = ok && c > 0x20 && c < 0x7f;
  if (!ok)
    fail(file, node,
         std::string(what) + " '" + printable(name.substr(0, 64)) +
             "' must be 1 to 128 printable ASCII characters without spaces");
}

void parse_slots(const YAML::Node& v, const std::string& file,
                 std::map<std::string, Setting<std::vector<std::string>>>& out) {
  if (v.IsNull()) return;
  if (!v.IsMap()) fail(file, v, "kernels.slots must be a mapping of slot name to settings");
  for (const auto& s : v) {
    const std::string slot = s.first.Scalar();
    check_name(file, s.first, slot, "kernels.slots: slot name");
    if (!s.second.IsMap()) fail(file, s.second, "kernels.slots." + slot + " must be a mapping");
    for (const auto& sk : s.second) {
      if (sk.first.Scalar() != "allow") {
        fail(file, sk.first,
             "unknown key kernels.slots." + slot + "." + sk.first.Scalar() + " (expected allow)");
      }
      if (!sk.second.IsSequence()) {
        fail(file, sk.second, "kernels.slots." + slot + ".allow must be a list of names");
      }
      std::vector<std::string> names;
      for (const auto& n : sk.second) {
        if (!n.IsScalar()) fail(file, n, "kernels.slots." + slot + ".allow: names must be strings");
        check_name(file, n, n.Scalar(), ("kernels.slots." + slot + ".allow: name").c_str());
        names.push_back(normalize(n.Scalar()));
      }
      out[slot] = {names, Source::file, where(file, s.first)};  // errors name the slot's key
    }
  }
}

void apply_environment(const Environment& env, Policy& p) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  auto forced = get("LIBREYOLO_KERNELS");
  std::string value = forced ? normalize(*forced) : "";
  std::string origin = "LIBREYOLO_KERNELS";
  if (value.empty()) {
    // Legacy alias: consulted only when LIBREYOLO_KERNELS is unset or empty.
    auto legacy = get("LIBREYOLO_QUANT_KERNELS");
    if (legacy && !normalize(*legacy).empty()) {
      value = normalize(*legacy);
      origin = "LIBREYOLO_QUANT_KERNELS";
      p.selection_from_legacy_alias = true;
    }
  }
  if (!value.empty()) p.selection = {value, Source::environment, origin};

  if (auto layouts = get("LIBREYOLO_LAYOUTS"); layouts && !normalize(*layouts).empty()) {
    auto t = tri_state(*layouts);
    if (!t)
      throw PolicyError("LIBREYOLO_LAYOUTS must be default, on or off, got '" + *layouts + "'");
    p.layouts = {static_cast<LayoutMode>(*t), Source::environment, "LIBREYOLO_LAYOUTS"};
  }
  if (auto hub = get("LIBREYOLO_HUB_KERNELS"); hub && !normalize(*hub).empty()) {
    if (!is_falsy(*hub) && !is_truthy(*hub))
      throw PolicyError("LIBREYOLO_HUB_KERNELS must be on or off (1/0, true/false, yes/no), got '" +
                        *hub + "'");
    p.hub_kernels = {!is_falsy(*hub), Source::environment, "LIBREYOLO_HUB_KERNELS"};
  }
  if (auto plugins = get("LIBREYOLO_KERNEL_PLUGINS"); plugins && !plugins->empty()) {
    p.plugins = {*plugins, Source::environment, "LIBREYOLO_KERNEL_PLUGINS"};
  }
  if (auto off = get("HF_HUB_OFFLINE")) {
    const std::string v = normalize(*off);
    if (v == "1" || v == "true" || v == "yes" || v == "on") {
      p.hub.offline = {true, Source::environment, "HF_HUB_OFFLINE"};
    }
  }
  if (auto ep = get("HF_ENDPOINT"); ep && !ep->empty()) {
    p.hub.endpoint = {*ep, Source::environment, "HF_ENDPOINT"};
  }
  if (auto t = get("HF_TOKEN"); t && !t->empty()) p.hub.token = *t;
  if (auto hf_home = get("HF_HOME"); hf_home && !hf_home->empty()) {
    p.hub.fallback_cache_dir = *hf_home + "/hub";
  } else if (auto home = get("HOME"); home && !home->empty()) {
    p.hub.fallback_cache_dir = *home + "/.cache/huggingface/hub";
  }
  if (auto c = get("KERNELS_CACHE"); c && !c->empty()) {
    p.hub.cache_dir = {*c, Source::environment, "KERNELS_CACHE"};
  } else if (auto h = get("HF_HUB_CACHE"); h && !h->empty() && p.hub.cache_dir.value.empty()) {
    p.hub.cache_dir = {*h, Source::environment, "HF_HUB_CACHE"};
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The lock file as described at start-up (the hub provider computes the same default).
std::string lock_file_display(const HubSettings& hub) {
  if (!hub.lock_file.value.empty()) return hub.lock_file.value;
  if (hub.config_file.empty()) return "(none: no configuration file)";
  const auto slash = hub.config_file.rfind('/');
  return (slash == std::string::npos ? std::string() : hub.config_file.substr(0, slash + 1)) +
         "kernels.lock";
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

std::string yaml_location(const std::string& file, const YAML::Node& node) {
  const auto m = node.Mark();
  if (m.is_null()) return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

const char* source_name(Source source) {
  switch (source) {
    case Source::default_value:
      return "default";
    case Source::file:
      return "file";
    case Source::environment:
      return "environment";
    case Source::flag:
      return "flag";
  }
  return "?";
}

const char* fused_attention_name(FusedAttention value) {
  switch (value) {
    case FusedAttention::family_default:
      return "default";
    case FusedAttention::on:
      return "on";
    case FusedAttention::off:
      return "off";
  }
  return "?";
}

const char* layout_mode_name(LayoutMode value) {
  switch (value) {
    case LayoutMode::family_default:
      return "default";
    case LayoutMode::on:
      return "on";
    case LayoutMode::off:
      return "off";
  }
  return "?";
}

std::string normalize(const std::string& value) {
  size_t b = 0, e = value.size();
  while (b < e && std::isspace(static_cast<unsigned char>(value[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(value[e - 1]))) --e;
  std::string out = value.substr(b, e - b);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool is_falsy(const std::string& value) {
  const std::string v = normalize(value);
  return v == "0" || v == "false" || v == "off" || v == "no";
}

bool is_truthy(const std::string& value) {
  const std::string v = normalize(value);
  return v == "1" || v == "true" || v == "on" || v == "yes";
}

namespace {

std::string prefix(Source source, const std::string& origin) {
  if (origin.empty()) return std::string(source_name(source)) + ": ";
  return origin + ": ";
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void check_names(const std::map<std::string, Setting<std::vector<std::string>>>& slot_allow,
                 const Registry& registry) {
  const auto slots = registry.declared_slots();
  const auto names = registry.known_names();
  for (const auto& [slot, allow] : slot_allow) {
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) {
      throw PolicyError(prefix(allow.source, allow.origin) + "unknown slot '" + slot +
                        "' in kernels.slots (declared: " + listed(slots) + ")");
    }
    for (const auto& n : allow.value) {
      if (!names.count(n)) {
        throw PolicyError(prefix(allow.source, allow.origin) + "kernels.slots." + slot +
                          ".allow: unknown implementation '" + n +
                          "' (known: " + listed({names.begin(), names.end()}) + ")");
      }
    }
  }
}

void check_names(const Policy& policy, const Registry& registry) {
  const std::string& s = policy.selection.value;
  if (s != "auto" && s != "off" && s != "reference" && !s.empty()) {
    const auto names = registry.known_names();
    if (!names.count(s)) {
      throw PolicyError(prefix(policy.selection.source, policy.selection.origin) +
                        "kernels.selection: unknown implementation '" + s +
                        "' (expected auto, off, reference or one of: " +
                        listed({names.begin(), names.end()}) + ")");
    }
  }
  check_names(policy.slot_allow, registry);
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string k = kv.substr(0, eq);
    if (k.rfind("LIBREYOLO_", 0) == 0 || k.rfind("HF_", 0) == 0 || k.rfind("KERNELS_", 0) == 0 ||
        k == "HOME") {
      env[k] = kv.substr(eq + 1);
    }
  }
  return env;
}

Policy policy_from_environment(const Environment& env) {
  Policy p;
  apply_environment(env, p);
  return p;
}

Policy parse_policy(const YAML::Node& kernels, const std::string& file, const Environment& env) {
  Policy p;
  p.hub.config_file = file;
  if (kernels && !kernels.IsNull()) {
    if (!kernels.IsMap()) fail(file, kernels, "kernels must be a mapping");
    for (const auto& kv : kernels) {
      const std::string key = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (key == "selection") {
        const std::string s = normalize(scalar(file, v, key));
        if (s.empty()) fail(file, v, "kernels.selection must not be empty");
        p.selection = {s, Source::file, where(file, v)};
      } else if (key == "hub_kernels") {
        p.hub_kernels = {boolean(file, v, "kernels.hub_kernels"), Source::file, where(file, v)};
      } else if (key == "fused_attention") {
        const std::string s = v.IsScalar() ? normalize(v.Scalar()) : "";
        FusedAttention f;
        // YAML 1.1 reads bare on/off as booleans; both spellings mean the same here.
        if (s == "default") {
          f = FusedAttention::family_default;
        } else if (s == "on" || s == "true") {
          f = FusedAttention::on;
        } else if (s == "off" || s == "false") {
          f = FusedAttention::off;
        } else {
          fail(file, v, "kernels.fused_attention must be default, on or off");
        }
        p.fused_attention = {f, Source::file, where(file, v)};
      } else if (key == "layouts") {
        auto t = v.IsScalar() ? tri_state(v.Scalar()) : std::nullopt;
        if (!t) fail(file, v, "kernels.layouts must be default, on or off");
        p.layouts = {static_cast<LayoutMode>(*t), Source::file, where(file, v)};
      } else if (key == "slots") {
        parse_slots(v, file, p.slot_allow);
      } else if (key == "hub") {
        parse_hub(v, file, p.hub);
      } else {
        fail(file, kv.first,
             "unknown key kernels." + key +
                 " (expected selection, hub_kernels, fused_attention, layouts, slots, hub)");
      }
    }
  }
  apply_environment(env, p);
  return p;
}

ModelKernelPolicy parse_model_kernels(const YAML::Node& kernels, const std::string& file) {
  ModelKernelPolicy out;
  if (!kernels || kernels.IsNull()) return out;
  if (!kernels.IsMap()) fail(file, kernels, "kernels must be a mapping");
  for (const auto& kv : kernels) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "slots") {
      parse_slots(v, file, out.slot_allow);
    } else if (key == "layouts") {
      auto t = v.IsScalar() ? tri_state(v.Scalar()) : std::nullopt;
      if (!t) fail(file, v, "kernels.layouts must be default, on or off");
      out.layouts = Setting<LayoutMode>{static_cast<LayoutMode>(*t), Source::file, where(file, v)};
    } else {
      fail(file, kv.first, "unknown key kernels." + key + " (expected slots, layouts)");
    }
  }
  return out;
}

SlotAllow ModelKernelPolicy::allow() const {
  SlotAllow out;
  for (const auto& [slot, names] : slot_allow) out[slot] = names.value;
  return out;
}

Policy load_policy_file(const std::string& file, const Environment& env) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::BadFile&) {
    throw PolicyError(file + ": cannot read the file");
  } catch (const YAML::ParserException& e) {
    throw PolicyError(file + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": " + printable(e.msg));
  }
  if (root.IsNull()) return parse_policy(YAML::Node(), file, env);
  if (!root.IsMap()) throw PolicyError(file + ": the configuration must be a mapping");
  return parse_policy(root["kernels"], file, env);
}

Filter Policy::filter() const {
  Filter f;
  const std::string& s = selection.value;
  if (s == "off" || s == "reference") {
    f.mode = Filter::Mode::reference_only;
  } else if (s != "auto" && !s.empty()) {
    f.mode = Filter::Mode::only_name;
    f.name = s;
  }
  for (const auto& [slot, names] : slot_allow) f.allow[slot] = names.value;
  if (!hub_kernels.value) f.disabled_providers.insert("hub");
  return f;
}

std::string Policy::describe() const {
  std::ostringstream os;
  auto row = [&](const std::string& key, const std::string& value, Source src,
                 const std::string& origin) {
    os << "  " << key << " = " << value << "  (" << source_name(src)
       << (origin.empty() ? "" : ": " + origin) << ")\n";
  };
  row("selection", selection.value, selection.source, selection.origin);
  row("hub_kernels", hub_kernels.value ? "on" : "off", hub_kernels.source, hub_kernels.origin);
  row("fused_attention", fused_attention_name(fused_attention.value), fused_attention.source,
      fused_attention.origin);
  row("layouts", layout_mode_name(layouts.value), layouts.source, layouts.origin);
  for (const auto& [slot, names] : slot_allow) {
    row("slots." + slot + ".allow", "[" + join(names.value) + "]", names.source, names.origin);
  }
  row("hub.endpoint", hub.endpoint.value, hub.endpoint.source, hub.endpoint.origin);
  row("hub.offline", hub.offline.value ? "true" : "false", hub.offline.source, hub.offline.origin);
  row("hub.cache_dir", hub.cache_dir.value.empty() ? "(hub default)" : hub.cache_dir.value,
      hub.cache_dir.source, hub.cache_dir.origin);
  row("hub.lock_file", lock_file_display(hub), hub.lock_file.source, hub.lock_file.origin);
  std::ostringstream timeout;
  timeout << hub.timeout_seconds.value;
  row("hub.timeout_seconds", timeout.str(), hub.timeout_seconds.source, hub.timeout_seconds.origin);
  row("hub.token", hub.token.empty() ? "(unset)" : "(set)",
      hub.token.empty() ? Source::default_value : Source::environment,
      hub.token.empty() ? "" : "HF_TOKEN");
  return os.str();
}

}  // namespace libreyolo::kernels
