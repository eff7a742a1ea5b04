#include "models/text/tokenizer_files.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/core/config.h"

namespace libreyolo::models::text {

using core::ConfigError;

namespace {
constexpr std::int64_t kMaxFileBytes = std::int64_t{64} << 20;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open");
  std::string text;
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (static_cast<std::int64_t>(text.size()) > kMaxFileBytes)
      throw ConfigError(path + ": more than the 67108864 bytes (64 MiB) a tokenizer file may have");
  }
  return text;
}

nlohmann::json read_tokenizer_config(const std::string& dir) {
  const std::string file = dir + "/tokenizer_config.json";
  if (!file_exists(file)) return nlohmann::json::object();
  nlohmann::json config = core::read_json_file(file);
  if (!config.is_object()) throw ConfigError(file + ": not a JSON object");
  return config;
}

std::string special_token(const nlohmann::json& config, const std::string& file,
                          const std::string& key, const std::string& fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  throw ConfigError(file + ": field '" + key +
                    "': expected a string or an object with a string 'content', found " +
                    it->type_name());
}

bool config_bool(const nlohmann::json& config, const std::string& file, const std::string& key,
                 bool fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    throw ConfigError(file + ": field '" + key + "': expected a boolean, found " + it->type_name());
  return it->get<bool>();
}

std::int64_t config_model_max_length(const nlohmann::json& config, const std::string& file) {
  const auto it = config.find("model_max_length");
  if (it == config.end() || it->is_null()) return 0;
  if (!it->is_number())
    throw ConfigError(file + ": field 'model_max_length': expected a number, found " +
                      it->type_name());
  const double value = it->get<double>();
  if (value > 1e9) return 0;
  if (value < 2 || value != static_cast<double>(static_cast<std::int64_t>(value)))
    throw ConfigError(file +
                      ": field 'model_max_length': expected an integer of at least 2, found " +
                      it->dump());
  return static_cast<std::int64_t>(value);
}

bool pad_left(const nlohmann::json& config, const std::string& file) {
  const std::string side = special_token(config, file, "padding_side", "right");
  if (side != "left" && side != "right")
    throw ConfigError(file + ": field 'padding_side': expected \"left\" or \"right\", found \"" +
                      side + "\"");
  return side == "left";
}

Vocabulary vocabulary_object(const nlohmann::json& json, const std::string& file,
                             const std::string& what) {
  if (!json.is_object())
    throw ConfigError(file + ": " + what + ": expected a JSON object of token -> id, found " +
                      json.type_name());
  Vocabulary vocab;
  vocab.reserve(json.size());
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<std::int64_t>() < 0 ||
        it.value().get<std::int64_t>() > (std::int64_t{1} << 31))
      throw ConfigError(file + ": " + what + ": token '" + it.key() +
                        "': expected a non-negative integer id, found " + it.value().dump());
    vocab[it.key()] = it.value().get<std::int64_t>();
  }
  return vocab;
}

std::int64_t special_token_id(const Vocabulary& vocab, const std::string& token,
                              const std::string& file, const std::string& key) {
  const auto it = vocab.find(token);
  if (it == vocab.end())
    throw ConfigError(file + ": " + key + " '" + token + "' is not in the vocabulary");
  return it->second;
}

const nlohmann::json& tokenizer_json_model(const nlohmann::json& tokenizer_json,
                                           const std::string& file, const std::string& type) {
  const auto model =
      tokenizer_json.is_object() ? tokenizer_json.find("model") : tokenizer_json.end();
  if (model == tokenizer_json.end() || !model->is_object())
    throw ConfigError(file + ": field 'model': missing or not an object");
  if (model->value("type", type) != type)
    throw ConfigError(file + ": field 'model.type': expected \"" + type + "\", found " +
                      (*model)["type"].dump());
  if (!model->contains("vocab")) throw ConfigError(file + ": field 'model.vocab': missing");
  return *model;
}

void add_json_added_tokens(const nlohmann::json& tokenizer_json, const std::string& file,
                           AddedTokens& added) {
  const auto list = tokenizer_json.find("added_tokens");
  if (list == tokenizer_json.end() || list->is_null()) return;
  if (!list->is_array())
    throw ConfigError(file + ": field 'added_tokens': expected an array, found " +
                      list->type_name());
  for (const nlohmann::json& a : *list) {
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
        !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<std::int64_t>() < 0)
      throw ConfigError(file +
                        ": field 'added_tokens': expected objects with a string 'content' and a "
                        "non-negative integer 'id', found " +
                        a.dump().substr(0, 200));
    added.add(a["content"].get<std::string>(), a["id"].get<std::int64_t>());
  }
}

}  // namespace libreyolo::models::text
