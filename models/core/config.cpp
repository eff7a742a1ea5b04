#include "models/core/config.h"

#include "kernels/policy.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace libreyolo::models::core {
namespace {

/// A field name for an error message, control characters as \xNN (kernels::printable), so
/// that the message stays one line (a key of config.json may hold any JSON string:
/// config_json_fuzz, tests/fuzz/corpus/config_json/regress-newline-key.json).
std::string printable_key(const std::string& key) { return kernels::printable(key); }

std::string brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

std::string read_json_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open");
  auto too_large = [&](const std::string& size) {
    return ConfigError(path + ": " + size + " bytes, more than the " +
                       std::to_string(kMaxJsonFileBytes) +
                       " (16 MiB) a JSON configuration file may have");
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > kMaxJsonFileBytes)
    throw too_large(std::to_string(st.st_size));
  // A FIFO or device has no size to check first: read up to one byte past the cap.
  std::string text(static_cast<std::size_t>(kMaxJsonFileBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (static_cast<std::int64_t>(text.size()) > kMaxJsonFileBytes)
    throw too_large("at least " + std::to_string(kMaxJsonFileBytes + 1));
  return text;
}

std::string clip_json_error(std::string what) {
  for (auto& c : what) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  constexpr std::size_t kLongest = 64, kKept = 48;
  std::string out;
  std::size_t at = 0;
  while (at < what.size()) {
    const std::size_t open = what.find('\'', at);
    if (open == std::string::npos) {
      out += what.substr(at);
      break;
    }
    std::size_t close = what.find('\'', open + 1);
    // An unterminated quote runs to the end of the message.
    const std::size_t end = close == std::string::npos ? what.size() : close;
    const std::size_t length = end - open - 1;
    out += what.substr(at, open + 1 - at);
    if (length > kLongest) {
      out += what.substr(open + 1, kKept) + "...' (" + std::to_string(length) + " characters)";
    } else {
      out += what.substr(open + 1, length) + (close == std::string::npos ? "" : "'");
    }
    if (close == std::string::npos) break;
    at = close + 1;
  }
  if (out.size() > 1024) out = out.substr(0, 1021) + "...";
  return out;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": invalid JSON: " + clip_json_error(e.what()));
  }
}

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_text(read_json_text(path), path);
}

ConfigView::ConfigView(const nlohmann::json& json, std::string file, std::string prefix)
    : json_(&json), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!json.is_object()) {
    if (prefix_.empty()) throw ConfigError(file_ + ": not a JSON object");
    throw ConfigError(file_ + ": field '" + printable_key(prefix_) +
                      "': expected an object, found " + brief(json));
  }
}

std::string ConfigView::path(const std::string& field) const {
  return prefix_.empty() ? field : prefix_ + "." + field;
}

void ConfigView::fail(const std::string& field, const std::string& problem) const {
  throw ConfigError(file_ + ": field '" + printable_key(path(field)) + "': " + problem);
}

const nlohmann::json* ConfigView::find(const std::string& field) const {
  auto it = json_->find(field);
  if (it == json_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigView::has(const std::string& field) const { return find(field) != nullptr; }

const nlohmann::json& ConfigView::raw(const std::string& field) const {
  const auto* v = find(field);
  if (v == nullptr) fail(field, "missing");
  return *v;
}

namespace {

bool as_int(const nlohmann::json& v, int64_t& out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return false;
    out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      out = static_cast<int64_t>(d);
      return true;
    }
  }
  return false;
}

}  // namespace

int64_t ConfigView::get_int(const std::string& field) const {
  const auto& v = raw(field);
  int64_t out = 0;
  if (!as_int(v, out)) fail(field, "expected an integer, found " + brief(v));
  return out;
}
int64_t ConfigView::get_int(const std::string& field, int64_t fallback) const {
  return has(field) ? get_int(field) : fallback;
}

double ConfigView::get_double(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_number()) fail(field, "expected a number, found " + brief(v));
  return v.get<double>();
}
double ConfigView::get_double(const std::string& field, double fallback) const {
  return has(field) ? get_double(field) : fallback;
}

bool ConfigView::get_bool(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_boolean()) fail(field, "expected true or false, found " + brief(v));
  return v.get<bool>();
}
bool ConfigView::get_bool(const std::string& field, bool fallback) const {
  return has(field) ? get_bool(field) : fallback;
}

std::string ConfigView::get_string(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_string()) fail(field, "expected a string, found " + brief(v));
  return v.get<std::string>();
}
std::string ConfigView::get_string(const std::string& field, const std::string& fallback) const {
  return has(field) ? get_string(field) : fallback;
}

std::vector<int64_t> ConfigView::get_int_list(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_array()) fail(field, "expected a list of integers, found " + brief(v));
  std::vector<int64_t> out;
  for (const auto& e : v) {
    int64_t x = 0;
    if (!as_int(e, x)) fail(field, "expected a list of integers, found " + brief(v));
    out.push_back(x);
  }
  return out;
}
std::vector<int64_t> ConfigView::get_int_list(const std::string& field,
                                              const std::vector<int64_t>& fallback) const {
  return has(field) ? get_int_list(field) : fallback;
}

std::vector<double> ConfigView::get_double_list(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_array()) fail(field, "expected a list of numbers, found " + brief(v));
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) fail(field, "expected a list of numbers, found " + brief(v));
    out.push_back(e.get<double>());
  }
  return out;
}
std::vector<double> ConfigView::get_double_list(const std::string& field,
                                                const std::vector<double>& fallback) const {
  return has(field) ? get_double_list(field) : fallback;
}

std::vector<int64_t> ConfigView::get_int_or_list(const std::string& field, int64_t fallback) const {
  if (!has(field)) return {fallback};
  if (raw(field).is_array()) return get_int_list(field);
  return {get_int(field)};
}

ConfigView ConfigView::child(const std::string& field) const {
  const auto& v = raw(field);
  if (!v.is_object()) fail(field, "expected an object, found " + brief(v));
  return ConfigView(v, file_, path(field));
}

std::string ConfigView::get_enum(const std::string& field, const std::string& fallback,
                                 const std::vector<std::string>& allowed) const {
  const std::string value = get_string(field, fallback);
  for (const auto& a : allowed)
    if (a == value) return value;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
  // The value as JSON (quoted, control characters escaped, clipped): one line
  // (a config_json_fuzz finding: a newline in model_type made two).
  fail(field, "unsupported value " + brief(nlohmann::json(value)) + " (supported: " + list + ")");
}

std::map<int64_t, std::string> ConfigView::id2label() const {
  std::map<int64_t, std::string> out;
  if (!has("id2label")) return out;
  const auto& v = raw("id2label");
  if (!v.is_object()) fail("id2label", "expected an object, found " + brief(v));
  for (auto it = v.begin(); it != v.end(); ++it) {
    int64_t id = 0;
    try {
      size_t pos = 0;
      id = std::stoll(it.key(), &pos);
      if (pos != it.key().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      fail("id2label", "key " + brief(nlohmann::json(it.key())) + " is not an integer");
    }
    if (!it.value().is_string())
      fail("id2label", "value of " + brief(nlohmann::json(it.key())) + " is not a string");
    out[id] = it.value().get<std::string>();
  }
  return out;
}

}  // namespace libreyolo::models::core
