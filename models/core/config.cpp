#include "models/core/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace libreyolo::models::core {
namespace {

std::string brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n') c = ' ';
    // The message quotes the offending token, which may be megabytes long (a huge number).
    if (what.size() > 200) what = what.substr(0, 197) + "...";
    throw ConfigError(path + ": invalid JSON: " + what);
  }
}

ConfigView::ConfigView(const nlohmann::json& json, std::string file, std::string prefix)
    : json_(&json), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!json.is_object()) {
    if (prefix_.empty()) throw ConfigError(file_ + ": not a JSON object");
    throw ConfigError(file_ + ": field '" + prefix_ + "': expected an object, found " +
                      brief(json));
  }
}

std::string ConfigView::path(const std::string& field) const {
  return prefix_.empty() ? field : prefix_ + "." + field;
}

void ConfigView::fail(const std::string& field, const std::string& problem) const {
  throw ConfigError(file_ + ": field '" + path(field) + "': " + problem);
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
  fail(field, "unsupported value \"" + value + "\" (supported: " + list + ")");
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
      fail("id2label", "key \"" + it.key() + "\" is not an integer");
    }
    if (!it.value().is_string()) fail("id2label", "value of \"" + it.key() + "\" is not a string");
    out[id] = it.value().get<std::string>();
  }
  return out;
}

}  // namespace libreyolo::models::core
