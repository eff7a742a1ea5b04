// Reading a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json, vocab.txt,
// vocab.json, merges.txt) for the tokenizers of models/text/. Errors are core::ConfigError, one
// line that names the file (and the field or line).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>

#include "models/text/tokenizer.h"

namespace libreyolo::models::text {

using Vocabulary = std::unordered_map<std::string, std::int64_t>;

bool file_exists(const std::string& path);
/// The whole file. ConfigError "<path>: cannot open" (or too large: 64 MiB at most).
std::string read_text_file(const std::string& path);

/// <dir>/tokenizer_config.json as an object; an empty object when the file is absent.
/// ConfigError naming the file: invalid JSON, not an object.
nlohmann::json read_tokenizer_config(const std::string& dir);

/// A special token of tokenizer_config.json: a string, or an AddedToken object's "content"
/// (older files); `fallback` when absent or null. ConfigError "<file>: field '<key>': ...".
std::string special_token(const nlohmann::json& config, const std::string& file,
                          const std::string& key, const std::string& fallback);
/// A boolean field; `fallback` when absent or null.
bool config_bool(const nlohmann::json& config, const std::string& file, const std::string& key,
                 bool fallback);
/// model_max_length: 0 when absent, null or above 1e9 (transformers' VERY_LARGE_INTEGER, "no
/// limit"). ConfigError when not a number or below 2.
std::int64_t config_model_max_length(const nlohmann::json& config, const std::string& file);
/// padding_side: true for "left"; "right" or absent: false; anything else: ConfigError.
bool pad_left(const nlohmann::json& config, const std::string& file);

/// A token -> id object (vocab.json, tokenizer.json's model.vocab). ConfigError
/// "<file>: <what>: expected a JSON object of token -> id, found <type>" or "...: token '<t>':
/// expected a non-negative integer id".
Vocabulary vocabulary_object(const nlohmann::json& json, const std::string& file,
                             const std::string& what);

/// The id of a special token that the vocabulary must hold. ConfigError "<file>: <key> '<token>'
/// is not in the vocabulary".
std::int64_t special_token_id(const Vocabulary& vocab, const std::string& token,
                              const std::string& file, const std::string& key);

/// tokenizer.json's "model" object, whose "type" (when present) must be `type` and which must
/// have a "vocab". ConfigError "<file>: field 'model...': ...".
const nlohmann::json& tokenizer_json_model(const nlohmann::json& tokenizer_json,
                                           const std::string& file, const std::string& type);

/// Adds tokenizer.json's "added_tokens" (objects with "content" and "id"; the special tokens
/// again, or more) to `added`. ConfigError "<file>: field 'added_tokens': ...".
void add_json_added_tokens(const nlohmann::json& tokenizer_json, const std::string& file,
                           AddedTokens& added);

}  // namespace libreyolo::models::text
