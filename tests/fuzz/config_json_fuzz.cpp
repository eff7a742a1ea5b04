// libFuzzer target: the JSON configuration reader of config.json and preprocessor_config.json
// (models/core/config.cpp: parse_json_text, clip_json_error, ConfigView's typed getters and
// id2label), the torch-free layer every family's config parser and the image processor read
// through (the families' own parsers: model_config_fuzz). Every field of the input is read with
// every getter; each either returns or throws ConfigError naming the file. Seed corpus:
// tests/fuzz/corpus/config_json/ (every fixture's config.json and preprocessor_config.json).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "models/core/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using libreyolo::models::core::ConfigError;
using libreyolo::models::core::ConfigView;

const std::string kFile = "/repo/m/1/config.json";

template <class F>
void expect_config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    libreyolo::fuzz::expect_message(e.what(), kFile);
  }
}

void read_every_field(const ConfigView& v, const nlohmann::json& object, int depth) {
  expect_config_error([&] { (void)v.id2label(); });
  for (auto it = object.begin(); it != object.end(); ++it) {
    // Named copies: clang 14 cannot capture structured bindings in the lambdas.
    const std::string key = it.key();
    const nlohmann::json& value = it.value();
    expect_config_error([&] { (void)v.has(key); });
    expect_config_error([&] { (void)v.get_int(key); });
    expect_config_error([&] { (void)v.get_int(key, 7); });
    expect_config_error([&] { (void)v.get_double(key); });
    expect_config_error([&] { (void)v.get_bool(key, false); });
    expect_config_error([&] { (void)v.get_string(key); });
    expect_config_error([&] { (void)v.get_int_list(key); });
    expect_config_error([&] { (void)v.get_double_list(key, {}); });
    expect_config_error([&] { (void)v.get_int_or_list(key, 3); });
    expect_config_error([&] { (void)v.get_enum(key, "a", {"a", "b"}); });
    expect_config_error([&] { (void)v.raw(key); });
    if (depth < 4 && value.is_object()) {
      expect_config_error([&] { read_every_field(v.child(key), value, depth + 1); });
    } else {
      expect_config_error([&] { (void)v.child(key); });
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json json;
  try {
    json = libreyolo::models::core::parse_json_text(text, kFile);
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    libreyolo::fuzz::expect_message(m, kFile);
    // clip_json_error: at most 1024 characters of nlohmann's message after "<file>: invalid JSON:
    // ".
    if (m.size() > kFile.size() + 16 + 1024) libreyolo::fuzz::fail("unclipped message");
    return 0;
  }
  try {
    const ConfigView view(json, kFile);
    read_every_field(view, json, 0);
  } catch (const ConfigError& e) {
    libreyolo::fuzz::expect_message(e.what(), kFile);
    if (json.is_object()) libreyolo::fuzz::fail("ConfigView refused an object");
  }
  return 0;
}
