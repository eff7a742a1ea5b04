// Typed, error-reporting access to config.json (and preprocessor_config.json) fields.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace libreyolo::models::core {

/// A config problem: one line "<dir>/config.json: field '<path>': <problem>".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Largest JSON configuration file read, bytes (16 MiB). Hugging Face config.json and
/// preprocessor_config.json files are kilobytes (a 22k-class id2label is about 1 MB); without a
/// cap a 1 GB file (one huge number) was buffered whole, on each of the parallel loaders.
constexpr std::int64_t kMaxJsonFileBytes = std::int64_t{16} << 20;

/// Reads a JSON configuration file's text. Throws ConfigError naming the path: cannot open, or
/// more than kMaxJsonFileBytes ("<path>: 17825792 bytes, more than the 16777216 (16 MiB) a JSON
/// configuration file may have"; files that are not regular are read up to the cap).
std::string read_json_text(const std::string& path);

/// Parses JSON text read from `path`. Throws ConfigError "<path>: invalid JSON: <nlohmann's
/// message>" on one line, each quoted token longer than 64 characters clipped (see
/// clip_json_error).
nlohmann::json parse_json_text(const std::string& text, const std::string& path);

/// nlohmann's exception message on one line, with every quoted token ('...') longer than 64
/// characters cut to its first 48 and its length ("'1000000...' (3145729 characters)"): the
/// parser quotes the offending token whole, which may be megabytes (a 3 MB number). At most
/// 1024 characters.
std::string clip_json_error(std::string what);

/// read_json_text then parse_json_text. Throws ConfigError naming the path (cannot open, too
/// large, invalid JSON).
nlohmann::json read_json_file(const std::string& path);

/// A view on one JSON object of a config file. Holds a pointer: the json must outlive it.
/// Field paths in messages are dotted from the file root ("backbone_config.layer_type").
/// A field that is absent or JSON null counts as absent (transformers writes null for unset).
class ConfigView {
 public:
  /// `file` is what messages name (e.g. "<dir>/config.json"). Throws ConfigError if `json` is
  /// not an object.
  ConfigView(const nlohmann::json& json, std::string file, std::string prefix = {});

  const std::string& file() const { return file_; }
  /// Present and not null.
  bool has(const std::string& field) const;

  /// Typed getters: throw ConfigError "…field 'x': missing" / "…: expected an integer, found …".
  /// Integers accept JSON integers only (and floats with an integral value); doubles accept any
  /// number; bools accept true/false.
  int64_t get_int(const std::string& field) const;
  int64_t get_int(const std::string& field, int64_t fallback) const;
  double get_double(const std::string& field) const;
  double get_double(const std::string& field, double fallback) const;
  bool get_bool(const std::string& field) const;
  bool get_bool(const std::string& field, bool fallback) const;
  std::string get_string(const std::string& field) const;
  std::string get_string(const std::string& field, const std::string& fallback) const;
  std::vector<int64_t> get_int_list(const std::string& field) const;
  std::vector<int64_t> get_int_list(const std::string& field,
                                    const std::vector<int64_t>& fallback) const;
  std::vector<double> get_double_list(const std::string& field) const;
  std::vector<double> get_double_list(const std::string& field,
                                      const std::vector<double>& fallback) const;
  /// An int or a list of ints (e.g. D-FINE decoder_n_points), as a list.
  std::vector<int64_t> get_int_or_list(const std::string& field, int64_t fallback) const;

  /// The nested object `field` (throws when missing or not an object).
  ConfigView child(const std::string& field) const;
  /// The raw JSON of `field` (throws when missing).
  const nlohmann::json& raw(const std::string& field) const;

  /// Throws ConfigError "<file>: field '<path>': <problem>" (for values we do not implement).
  [[noreturn]] void fail(const std::string& field, const std::string& problem) const;
  /// Requires get_string(field, fallback) to be one of `allowed`; returns it.
  std::string get_enum(const std::string& field, const std::string& fallback,
                       const std::vector<std::string>& allowed) const;

  /// config.json `id2label` ({"0": "person", ...}); empty when absent. Throws ConfigError on a
  /// key that is not an integer or a value that is not a string.
  std::map<int64_t, std::string> id2label() const;

 private:
  const nlohmann::json* find(const std::string& field) const;
  std::string path(const std::string& field) const;
  const nlohmann::json* json_;
  std::string file_;
  std::string prefix_;
};

}  // namespace libreyolo::models::core
