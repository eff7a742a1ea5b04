#include "server/core/config.h"

#include <yaml-cpp/yaml.h>

#include "kernels/policy.h"

#include <fstream>
#include <sstream>

namespace libreyolo::server {
namespace {

std::string where(const std::string& file, const YAML::Node& node) {
  return kernels::yaml_location(file, node);
}

[[noreturn]] void fail(const std::string& file, const YAML::Node& node, const std::string& msg) {
  throw ConfigError(where(file, node) + ": " + msg);
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

void parse_server(const YAML::Node& n, const std::string& file, ServerConfig& c) {
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
               key == "max_pixels_per_image" || key == "preprocess_threads") {
      const auto i = as<std::int64_t>(file, v, full, "an integer");
      const bool zero_ok = key == "preprocess_threads";
      if (i < 0 || (i == 0 && !zero_ok)) fail(file, v, full + " must be > 0");
      // Each is a std::thread started at once: a billion would abort the process.
      if (key == "preprocess_threads" && i > 1024) fail(file, v, full + " must be at most 1024");
      auto& target = key == "max_message_bytes"        ? c.max_message_bytes
                     : key == "max_images_per_request" ? c.max_images_per_request
                     : key == "max_pixels_per_image"   ? c.max_pixels_per_image
                                                       : c.preprocess_threads;
      set(target, i, file, v);
    } else if (key == "model_control") {
      const auto s = as<std::string>(file, v, full, "none or explicit");
      if (s != "none" && s != "explicit")
        fail(file, v, full + " must be none or explicit, got '" + s + "'");
      set(c.model_control, s, file, v);
    } else if (key == "log_level") {
      const auto s = as<std::string>(file, v, full, "a level name");
      if (s != "debug" && s != "info" && s != "warn" && s != "warning" && s != "error" &&
          s != "off") {
        fail(file, v, full + " must be debug, info, warn, error or off, got '" + s + "'");
      }
      set(c.log_level, s, file, v);
    } else {
      fail(file, kv.first,
           "unknown key " + full +
               " (expected grpc_address, http_address, drain_seconds, max_message_bytes, "
               "max_images_per_request, max_pixels_per_image, preprocess_threads, model_control, "
               "log_level)");
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
    c.model_repository = {*o.model_repository, Source::file, "--model-repository"};
  if (o.grpc_address) c.grpc_address = {*o.grpc_address, Source::file, "--grpc-address"};
  if (o.http_address) c.http_address = {*o.http_address, Source::file, "--http-address"};
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
        parse_server(v, file, c);
      } else if (key == "model_repository") {
        set(c.model_repository, as<std::string>(file, v, key, "a directory path"), file, v);
      } else if (key == "device") {
        const auto d = as<std::string>(file, v, key, "auto, cpu, cuda or cuda:N");
        if (!valid_device(d))
          fail(file, v, "device must be auto, cpu, cuda or cuda:N, got '" + d + "'");
        set(c.device, d, file, v);
      } else if (key == "tf32") {
        // YAML 1.1 reads bare on/off as booleans.
        const auto t = kernels::normalize(as<std::string>(file, v, key, "default, on or off"));
        const std::string value = t == "true" ? "on" : t == "false" ? "off" : t;
        if (value != "default" && value != "on" && value != "off")
          fail(file, v, "tf32 must be default, on or off, got '" + v.Scalar() + "'");
        set(c.tf32, value, file, v);
      } else if (key == "kernels") {
        kernels_node = v;
      } else {
        fail(file, kv.first,
             "unknown key " + key + " (expected server, model_repository, device, tf32, kernels)");
      }
    }
  }
  try {
    c.kernels = kernels::parse_policy(kernels_node, file, env);
  } catch (const kernels::PolicyError& e) {
    throw ConfigError(e.what());
  }
  apply(overrides, c);
  return c;
}

std::string origin(Source s, const std::string& o) {
  if (s == Source::default_value) return "default";
  return std::string(o.rfind("--", 0) == 0      ? "flag "
                     : s == Source::environment ? "environment "
                                                : "") +
         o;
}

template <class T>
void row(std::ostringstream& out, const std::string& indent, const std::string& key,
         const Setting<T>& s) {
  out << indent << key << ": " << s.value << "  # " << origin(s.source, s.origin) << "\n";
}

}  // namespace

ServerConfig parse_config(const std::string& yaml_text, const std::string& file,
                          const Overrides& overrides, const kernels::Environment& env) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
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
  out << "# effective configuration" << (c.file.empty() ? "" : " (file " + c.file + ")") << "\n";
  out << "server:\n";
  row(out, "  ", "grpc_address", c.grpc_address);
  row(out, "  ", "http_address", c.http_address);
  row(out, "  ", "drain_seconds", c.drain_seconds);
  row(out, "  ", "max_message_bytes", c.max_message_bytes);
  row(out, "  ", "max_images_per_request", c.max_images_per_request);
  row(out, "  ", "max_pixels_per_image", c.max_pixels_per_image);
  row(out, "  ", "preprocess_threads", c.preprocess_threads);
  row(out, "  ", "model_control", c.model_control);
  row(out, "  ", "log_level", c.log_level);
  row(out, "", "model_repository", c.model_repository);
  row(out, "", "device", c.device);
  row(out, "", "tf32", c.tf32);
  out << "kernels:  # key, value, source\n" << c.kernels.describe();
  return out.str();
}

}  // namespace libreyolo::server
