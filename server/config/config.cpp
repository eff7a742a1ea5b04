#include "server/config/config.h"

#include <yaml-cpp/yaml.h>

#include "kernels/policy.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

namespace libreyolo::server {
namespace {

std::string where(const std::string& file, const YAML::Node& node) {
  return kernels::yaml_location(file, node);
}

[[noreturn]] void fail(const std::string& file, const YAML::Node& node, const std::string& msg) {
  throw ConfigError(where(file, node) + ": " + kernels::printable(msg));
}

template <class T>
T as(const std::string& file, const YAML::Node& node, const std::string& key, const char* what) {
  if (!node.IsScalar()) fail(file, node, key + " must be " + what);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    fail(file, node, key + " must be " + what + ", got '" + node.Scalar() + "'");
  }
}

template <class T>
void set(Setting<T>& s, T value, const std::string& file, const YAML::Node& node) {
  s = {std::move(value), Source::file, where(file, node)};
}

}  // namespace

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

std::string path_from_file(const std::string& file, const std::string& path) {
  namespace fs = std::filesystem;
  if (file.empty() || path.empty() || fs::path(path).is_absolute()) return path;
  fs::path dir = fs::path(file).parent_path();
  if (dir.empty()) dir = ".";
  return fs::absolute(dir / path).lexically_normal().string();
}

namespace {

/// server.tls: cert_file, key_file (both or neither), client_ca_file (needs the other two).
void parse_tls(const YAML::Node& n, const std::string& file, ServerConfig& c) {
  if (n.IsNull()) return;
  if (!n.IsMap())
    fail(file, n, "server.tls must be a mapping (cert_file, key_file, client_ca_file)");
  security::TlsFiles t;
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    const std::string full = "server.tls." + key;
    std::string* target = key == "cert_file"        ? &t.cert_file
                          : key == "key_file"       ? &t.key_file
                          : key == "client_ca_file" ? &t.client_ca_file
                                                    : nullptr;
    if (!target)
      fail(file, kv.first,
           "unknown key " + full + " (expected cert_file, key_file, client_ca_file)");
    const auto path = as<std::string>(file, kv.second, full, "a file path");
    if (path.empty()) fail(file, kv.second, full + " must not be empty");
    *target = path_from_file(file, path);
  }
  if (t.cert_file.empty() != t.key_file.empty())
    fail(file, n, "server.tls needs both cert_file and key_file");
  if (t.cert_file.empty() && !t.client_ca_file.empty())
    fail(file, n, "server.tls.client_ca_file needs cert_file and key_file");
  set(c.tls, t, file, n);
}

/// An HTTP header / gRPC metadata name a client can send: lower-case token characters, not one
/// the transports give a meaning to.
bool usable_header(const std::string& h) {
  if (h.empty() || h.size() > 64) return false;
  for (char ch : h) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'))
      return false;
  }
  static const char* const kReserved[] = {"host",
                                          "content-length",
                                          "content-type",
                                          "content-encoding",
                                          "transfer-encoding",
                                          "connection",
                                          "te",
                                          "user-agent",
                                          "authorization"};
  for (const char* r : kReserved) {
    if (h == r) return false;
  }
  return h.rfind("grpc-", 0) != 0;
}

/// server.restricted_apis: GROUP: open | loopback | {header: NAME, value: V | value_env: VAR}.
void parse_restricted(const YAML::Node& n, const std::string& file, const kernels::Environment& env,
                      ServerConfig& c) {
  if (n.IsNull()) return;
  if (!n.IsMap()) fail(file, n, "server.restricted_apis must be a mapping of API groups");
  security::AccessRules rules;
  bool metrics_set = false;
  for (const auto& kv : n) {
    const std::string group = kv.first.Scalar();
    const auto g = security::parse_group(group);
    if (!g)
      fail(file, kv.first,
           "unknown API group '" + group + "' in server.restricted_apis (expected " +
               security::group_names() + ")");
    if (*g == security::ApiGroup::metrics) metrics_set = true;
    const std::string full = "server.restricted_apis." + group;
    const YAML::Node& v = kv.second;
    security::AccessRule rule;
    if (v.IsScalar()) {
      const std::string kind = v.Scalar();
      if (kind == "open") {
        rule.kind = security::AccessRule::Kind::open;
      } else if (kind == "loopback") {
        rule.kind = security::AccessRule::Kind::loopback;
      } else {
        fail(file, v,
             full + " must be open, loopback or {header: NAME, value: VALUE}, got '" + kind + "'");
      }
      rules.set(*g, rule);
      continue;
    }
    if (!v.IsMap()) fail(file, v, full + " must be open, loopback or {header: NAME, value: VALUE}");
    rule.kind = security::AccessRule::Kind::header;
    bool has_value = false;
    for (const auto& f : v) {
      const std::string key = f.first.Scalar();
      if (key == "header") {
        rule.header = as<std::string>(file, f.second, full + ".header", "a header name");
        for (auto& ch : rule.header)
          ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (!usable_header(rule.header))
          fail(file, f.second,
               full +
                   ".header must be 1 to 64 letters, digits, '-' or '_', and not a header "
                   "the protocols reserve (host, content-*, te, grpc-*, ...), got '" +
                   f.second.Scalar() + "'");
      } else if (key == "value" || key == "value_env") {
        if (has_value) fail(file, f.first, full + " takes value or value_env, not both");
        has_value = true;
        if (key == "value") {
          rule.value = as<std::string>(file, f.second, full + ".value", "a string");
        } else {
          rule.value_env =
              as<std::string>(file, f.second, full + ".value_env", "an environment variable name");
          // The daemon reads only its own variables from the environment (kernels::
          // process_environment): LIBREYOLO_*, HF_*, KERNELS_*.
          if (rule.value_env.rfind("LIBREYOLO_", 0) != 0)
            fail(file, f.second,
                 full + ".value_env must name a LIBREYOLO_* environment variable, got '" +
                     rule.value_env + "'");
          const auto it = env.find(rule.value_env);
          if (it == env.end() || it->second.empty())
            fail(file, f.second,
                 full + ".value_env: the environment variable " + rule.value_env + " is not set");
          rule.value = it->second;
        }
        if (rule.value.empty()) fail(file, f.second, full + ": the value must not be empty");
        for (char ch : rule.value) {
          if (ch < 0x20 || ch > 0x7e)
            fail(file, f.second,
                 full +
                     ": the value must be printable ASCII (gRPC metadata and HTTP headers "
                     "carry it)");
        }
      } else {
        fail(file, f.first,
             "unknown key " + full + "." + key + " (expected header, value, value_env)");
      }
    }
    if (rule.header.empty() || !has_value)
      fail(file, v, full + " needs header and value (or value_env)");
    rules.set(*g, rule);
  }
  // /metrics was in the `admin` group until `metrics` had its own: a file that restricts admin
  // and says nothing of metrics keeps /metrics behind the same rule.
  if (!metrics_set) {
    auto rule = rules.rule(security::ApiGroup::admin);
    rule.inherited_from = security::group_name(security::ApiGroup::admin);
    rules.set(security::ApiGroup::metrics, rule);
  }
  set(c.restricted_apis, rules, file, n);
}

void parse_server(const YAML::Node& n, const std::string& file, const kernels::Environment& env,
                  ServerConfig& c) {
  if (n.IsNull()) return;
  if (!n.IsMap()) fail(file, n, "server must be a mapping");
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    const std::string full = "server." + key;
    if (key == "grpc_address") {
      set(c.grpc_address, as<std::string>(file, v, full, "a host:port string"), file, v);
    } else if (key == "http_address") {
      set(c.http_address, as<std::string>(file, v, full, "a host:port string"), file, v);
    } else if (key == "drain_seconds") {
      const double d = as<double>(file, v, full, "a number of seconds");
      // Also refuses .nan/.inf and values whose conversion to a timeout would overflow.
      if (!(d >= 0 && d <= 86400)) fail(file, v, full + " must be between 0 and 86400");
      set(c.drain_seconds, d, file, v);
    } else if (key == "max_message_bytes" || key == "max_images_per_request" ||
               key == "max_pixels_per_image" || key == "preprocess_threads" ||
               key == "intra_op_threads") {
      const auto i = as<std::int64_t>(file, v, full, "an integer");
      const bool threads = key == "preprocess_threads" || key == "intra_op_threads";
      if (threads && i < 0)
        fail(file, v, full + " must be >= 0 (0: one per core of the CPU budget)");
      if (!threads && i <= 0) fail(file, v, full + " must be > 0");
      // Each is a std::thread started at once: a billion would abort the process.
      if (threads && i > 1024) fail(file, v, full + " must be at most 1024");
      auto& target = key == "max_message_bytes"        ? c.max_message_bytes
                     : key == "max_images_per_request" ? c.max_images_per_request
                     : key == "max_pixels_per_image"   ? c.max_pixels_per_image
                     : key == "intra_op_threads"       ? c.intra_op_threads
                                                       : c.preprocess_threads;
      set(target, i, file, v);
    } else if (key == "max_concurrent_rpcs") {
      const auto i = as<std::int64_t>(file, v, full, "an integer");
      // Each is a thread holding up to max_message_bytes of request: a cap, not a wish. Below 2
      // gRPC's sync server cannot poll and answer at once.
      if (i < 2 || i > 4096) fail(file, v, full + " must be between 2 and 4096");
      set(c.max_concurrent_rpcs, i, file, v);
    } else if (key == "http_threads") {
      const auto i = as<std::int64_t>(file, v, full, "an integer");
      // Each is a thread started at once with an 8 MiB stack and may hold a request of up to
      // max_message_bytes.
      if (i < 2 || i > 1024) fail(file, v, full + " must be between 2 and 1024");
      set(c.http_threads, i, file, v);
    } else if (key == "model_control") {
      const auto s = as<std::string>(file, v, full, "none or explicit");
      if (s != "none" && s != "explicit")
        fail(file, v, full + " must be none or explicit, got '" + s + "'");
      set(c.model_control, s, file, v);
    } else if (key == "load_models") {
      if (!v.IsSequence()) fail(file, v, full + " must be a list of model names (\"*\": all)");
      std::vector<std::string> names;
      for (const auto& item : v) names.push_back(as<std::string>(file, item, full, "a model name"));
      set(c.load_models, names, file, v);
    } else if (key == "strict_readiness") {
      set(c.strict_readiness, as<bool>(file, v, full, "true or false"), file, v);
    } else if (key == "gpu_image_decode") {
      // YAML 1.1 reads bare on/off (and true/false) as booleans.
      const auto t = kernels::normalize(as<std::string>(file, v, full, "auto, on or off"));
      const std::string value = kernels::is_truthy(t) ? "on" : kernels::is_falsy(t) ? "off" : t;
      if (value != "auto" && value != "on" && value != "off")
        fail(file, v, full + " must be auto, on or off, got '" + v.Scalar() + "'");
      set(c.gpu_image_decode, value, file, v);
    } else if (key == "log_level") {
      const auto s = as<std::string>(file, v, full, "a level name");
      if (s != "debug" && s != "info" && s != "warn" && s != "warning" && s != "error" &&
          s != "off") {
        fail(file, v, full + " must be debug, info, warn, error or off, got '" + s + "'");
      }
      set(c.log_level, s, file, v);
    } else if (key == "tls") {
      parse_tls(v, file, c);
    } else if (key == "restricted_apis") {
      parse_restricted(v, file, env, c);
    } else {
      fail(file, kv.first,
           "unknown key " + full +
               " (expected grpc_address, http_address, drain_seconds, max_message_bytes, "
               "max_images_per_request, max_pixels_per_image, preprocess_threads, "
               "intra_op_threads, max_concurrent_rpcs, http_threads, model_control, load_models, "
               "strict_readiness, gpu_image_decode, "
               "log_level, tls, restricted_apis)");
    }
  }
}

bool valid_device(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5) return false;
  for (std::size_t i = 5; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') return false;
  }
  return true;
}

void apply(const Overrides& o, ServerConfig& c) {
  if (o.model_repository)
    c.model_repository = {*o.model_repository, Source::flag, "--model-repository"};
  if (o.grpc_address) c.grpc_address = {*o.grpc_address, Source::flag, "--grpc-address"};
  if (o.http_address) c.http_address = {*o.http_address, Source::flag, "--http-address"};
  if (!o.load_models.empty()) c.load_models = {o.load_models, Source::flag, "--load-model"};
  if (o.strict_readiness)
    c.strict_readiness = {*o.strict_readiness, Source::flag, "--strict-readiness"};
  if (o.drain_seconds) c.drain_seconds = {*o.drain_seconds, Source::flag, "--drain-seconds"};
}

ServerConfig parse_root(const YAML::Node& root, const std::string& file, const Overrides& overrides,
                        const kernels::Environment& env) {
  ServerConfig c;
  c.file = file;
  YAML::Node kernels_node;
  if (root && !root.IsNull()) {
    if (!root.IsMap()) fail(file, root, "the configuration must be a mapping");
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (key == "server") {
        parse_server(v, file, env, c);
      } else if (key == "model_repository") {
        // Relative to the file's folder, like kernels.lock next to it (and kernels.hub paths).
        set(c.model_repository,
            path_from_file(file, as<std::string>(file, v, key, "a directory path")), file, v);
      } else if (key == "device") {
        const auto d = as<std::string>(file, v, key, "auto, cpu, cuda or cuda:N");
        if (!valid_device(d))
          fail(file, v, "device must be auto, cpu, cuda or cuda:N, got '" + d + "'");
        set(c.device, d, file, v);
      } else if (key == "dtype") {
        const auto d = as<std::string>(file, v, key, "auto, float32, float16 or bfloat16");
        if (d != "auto" && d != "float32" && d != "float16" && d != "bfloat16")
          fail(file, v, "dtype must be auto, float32, float16 or bfloat16, got '" + d + "'");
        set(c.dtype, d, file, v);
      } else if (key == "tf32") {
        // YAML 1.1 reads bare on/off as booleans.
        const auto t = kernels::normalize(as<std::string>(file, v, key, "default, on or off"));
        const std::string value = t == "true" ? "on" : t == "false" ? "off" : t;
        if (value != "default" && value != "on" && value != "off")
          fail(file, v, "tf32 must be default, on or off, got '" + v.Scalar() + "'");
        set(c.tf32, value, file, v);
      } else if (key == "cudnn_benchmark") {
        set(c.cudnn_benchmark, as<bool>(file, v, key, "true or false"), file, v);
      } else if (key == "kernels") {
        kernels_node = v;
      } else {
        fail(file, kv.first,
             "unknown key " + key +
                 " (expected server, model_repository, device, dtype, tf32, cudnn_benchmark, "
                 "kernels)");
      }
    }
  }
  try {
    c.kernels = kernels::parse_policy(kernels_node, file, env);
  } catch (const kernels::PolicyError& e) {
    throw ConfigError(e.what());
  }
  // The daemon's log level: LIBREYOLO_LOG_LEVEL wins over the file (checked like the key).
  if (const auto it = env.find("LIBREYOLO_LOG_LEVEL"); it != env.end() && !it->second.empty()) {
    const auto& s = it->second;
    if (s != "debug" && s != "info" && s != "warn" && s != "warning" && s != "error" && s != "off")
      throw ConfigError("LIBREYOLO_LOG_LEVEL must be debug, info, warn, error or off, got '" + s +
                        "'");
    c.log_level = {s, Source::environment, "LIBREYOLO_LOG_LEVEL"};
  }
  apply(overrides, c);
  return c;
}

std::string origin(Source s, const std::string& o) {
  if (s == Source::default_value) return "default";
  return std::string(s == Source::flag          ? "flag "
                     : s == Source::environment ? "environment "
                                                : "") +
         o;
}

/// True when `s` reads back from a YAML plain scalar as the same text: not empty, not a null
/// spelling, no indicator at the start, no ": " / " #", no surrounding blanks, no control
/// characters. (Booleans and numbers are fine: the parser takes string keys as text.)
bool plain_safe(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return false;
  if (std::string("-?:,[]{}#&*!|>'\"%@`").find(s[0]) != std::string::npos) return false;
  if (s.front() == ' ' || s.back() == ' ' || s.back() == ':') return false;
  if (s.find(": ") != std::string::npos || s.find(" #") != std::string::npos) return false;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) return false;
  }
  return true;
}

/// A YAML scalar for the string `s`: plain when safe, else double-quoted with escapes.
std::string yaml_string(const std::string& s) {
  if (plain_safe(s)) return s;
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

/// The shortest decimal text that reads back as `v` (10, 2.5, 0.1).
std::string yaml_number(double v) {
  // YAML's spellings of the non-finite values (kernels.hub.timeout_seconds may be .inf).
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream os;
    os << std::setprecision(precision) << v;
    if (std::stod(os.str()) == v) return os.str();
  }
  return std::to_string(v);
}

std::string yaml_value(const std::string& v) { return yaml_string(v); }
std::string yaml_value(double v) { return yaml_number(v); }
std::string yaml_value(std::int64_t v) { return std::to_string(v); }
std::string yaml_value(bool v) { return v ? "true" : "false"; }
std::string yaml_value(const std::vector<std::string>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + yaml_string(v[i]);
  return out + "]";
}

/// A comment stays on its line.
std::string comment(std::string text) {
  for (auto& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return text;
}

template <class T>
void row(std::ostringstream& out, const std::string& indent, const std::string& key,
         const Setting<T>& s, const std::string& note = "") {
  out << indent << key << ": " << yaml_value(s.value) << "  # "
      << comment(origin(s.source, s.origin) + note) << "\n";
}

}  // namespace

ServerConfig parse_config(const std::string& yaml_text, const std::string& file,
                          const Overrides& overrides, const kernels::Environment& env) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": " + kernels::printable(e.msg));
  }
  return parse_root(root, file, overrides, env);
}

ServerConfig load_config(const std::string& file, const Overrides& overrides,
                         const kernels::Environment& env) {
  if (file.empty()) return parse_config("", "", overrides, env);
  std::ifstream in(file);
  if (!in) throw ConfigError(file + ": cannot read the configuration file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), file, overrides, env);
}

std::string describe(const ServerConfig& c) {
  std::ostringstream out;
  out << "# effective configuration" << (c.file.empty() ? "" : comment(" (file " + c.file + ")"))
      << "\n";
  out << "server:\n";
  row(out, "  ", "grpc_address", c.grpc_address);
  row(out, "  ", "http_address", c.http_address);
  row(out, "  ", "drain_seconds", c.drain_seconds);
  row(out, "  ", "max_message_bytes", c.max_message_bytes);
  row(out, "  ", "max_images_per_request", c.max_images_per_request);
  row(out, "  ", "max_pixels_per_image", c.max_pixels_per_image);
  row(out, "  ", "preprocess_threads", c.preprocess_threads);
  row(out, "  ", "intra_op_threads", c.intra_op_threads);
  row(out, "  ", "max_concurrent_rpcs", c.max_concurrent_rpcs);
  row(out, "  ", "http_threads", c.http_threads);
  row(out, "  ", "model_control", c.model_control);
  row(out, "  ", "load_models", c.load_models);
  row(out, "  ", "strict_readiness", c.strict_readiness);
  row(out, "  ", "gpu_image_decode", c.gpu_image_decode);
  row(out, "  ", "log_level", c.log_level);
  const auto& tls = c.tls.value;
  if (!tls.enabled()) {
    out << "  tls: {}  # " << comment(origin(c.tls.source, c.tls.origin) + " (plain text)") << "\n";
  } else {
    out << "  tls:  # " << comment(origin(c.tls.source, c.tls.origin)) << "\n";
    out << "    cert_file: " << yaml_string(tls.cert_file) << "\n";
    out << "    key_file: " << yaml_string(tls.key_file) << "\n";
    if (tls.mutual()) out << "    client_ca_file: " << yaml_string(tls.client_ca_file) << "\n";
  }
  out << "  restricted_apis:  # "
      << comment(origin(c.restricted_apis.source, c.restricted_apis.origin)) << "\n";
  for (int i = 0; i < security::kApiGroups; ++i) {
    const auto g = static_cast<security::ApiGroup>(i);
    const auto& r = c.restricted_apis.value.rule(g);
    out << "    " << security::group_name(g) << ": ";
    if (r.kind == security::AccessRule::Kind::open) {
      out << "open";
    } else if (r.kind == security::AccessRule::Kind::loopback) {
      out << "loopback";
    } else if (!r.value_env.empty()) {
      out << "{header: " << yaml_string(r.header) << ", value_env: " << yaml_string(r.value_env)
          << "}";
    } else {
      // Never the secret itself: the printed file does not read back to it.
      out << "{header: " << yaml_string(r.header) << ", value: \"(not shown)\"}";
    }
    if (!r.inherited_from.empty()) out << "  # " << r.inherited_from << "'s rule (not set)";
    out << "\n";
  }
  // Absolute, so that the printed file reads back to the same folder from wherever it is saved
  // (a relative path in a file is relative to that file's folder).
  auto absolute = [](Setting<std::string> p) {
    p.value = absolute_path(p.value);
    return p;
  };
  row(out, "", "model_repository", absolute(c.model_repository));
  row(out, "", "device", c.device);
  row(out, "", "dtype", c.dtype);
  row(out, "", "tf32", c.tf32);
  row(out, "", "cudnn_benchmark", c.cudnn_benchmark);
  const auto& k = c.kernels;
  out << "kernels:\n";
  row(out, "  ", "selection", k.selection,
      k.selection_from_legacy_alias ? " (legacy alias of LIBREYOLO_KERNELS)" : "");
  row(out, "  ", "hub_kernels", k.hub_kernels);
  const Setting<std::string> fused{kernels::fused_attention_name(k.fused_attention.value),
                                   k.fused_attention.source, k.fused_attention.origin};
  row(out, "  ", "fused_attention", fused);
  const Setting<std::string> layouts{kernels::layout_mode_name(k.layouts.value), k.layouts.source,
                                     k.layouts.origin};
  row(out, "  ", "layouts", layouts);
  if (k.slot_allow.empty()) {
    out << "  slots: {}  # default: every implementation allowed\n";
  } else {
    out << "  slots:\n";
    for (const auto& [slot, names] : k.slot_allow) {
      out << "    " << slot << ":\n";
      row(out, "      ", "allow", names);
    }
  }
  const auto& h = k.hub;
  out << "  hub:\n";
  row(out, "    ", "endpoint", h.endpoint);
  row(out, "    ", "cache_dir", absolute(h.cache_dir),
      h.cache_dir.value.empty() ? " (empty: KERNELS_CACHE, else HF_HUB_CACHE, else ~/.cache)" : "");
  row(out, "    ", "offline", h.offline);
  std::string lock_note;
  if (h.lock_file.value.empty()) {
    const auto slash = h.config_file.rfind('/');
    lock_note = h.config_file.empty()
                    ? " (empty: no lock file without a configuration file)"
                    : " (empty: " +
                          (slash == std::string::npos ? std::string()
                                                      : h.config_file.substr(0, slash + 1)) +
                          "kernels.lock, next to the configuration file)";
  }
  row(out, "    ", "lock_file", absolute(h.lock_file), lock_note);
  row(out, "    ", "timeout_seconds", h.timeout_seconds);
  // Never the token itself: only whether the environment set it.
  out << "  # hub token: " << (h.token.empty() ? "unset" : "set (environment HF_TOKEN)") << "\n";
  return out.str();
}

}  // namespace libreyolo::server
