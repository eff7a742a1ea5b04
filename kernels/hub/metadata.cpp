#include "kernels/hub/metadata.h"

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "kernels/hub/digest.h"
#include "kernels/policy.h"

namespace libreyolo::kernels::hub {
namespace {

/// [A-Za-z_][A-Za-z0-9_]*. Not std::regex: libstdc++'s matcher recurses once per character, and
/// a 20,000-character id overflowed the stack under AddressSanitizer (hub_metadata_fuzz,
/// tests/fuzz/corpus/hub_metadata/regress-long-id.json).
bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

bool excluded(const std::string& file) {
  if (file == "metadata.json" || file == "metadata.json.sigstore") return true;
  if (file.find("__pycache__") != std::string::npos) return true;
  return file.size() >= 4 && file.compare(file.size() - 4, 4, ".pyc") == 0;
}

}  // namespace

KernelMetadata read_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_metadata(text.str(), path);
}

KernelMetadata parse_metadata(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  KernelMetadata m;
  try {
    if (!j.is_object()) throw std::runtime_error("must be an object");
    m.id = j.at("id").get<std::string>();
    m.name = j.value("name", "");
    const auto& backend = j.at("backend");
    m.backend_type = backend.at("type").get<std::string>();
    if (backend.contains("archs")) m.archs = backend["archs"].get<std::vector<std::string>>();
    if (j.contains("digest") && !j["digest"].is_null()) {
      const auto& d = j["digest"];
      m.has_digest = true;
      m.digest_algorithm = d.at("algorithm").get<std::string>();
      m.digest_files = d.at("files").get<std::map<std::string, std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (!is_identifier(m.id)) {
    // A huge id is echoed clipped and control characters escaped (it becomes one log line).
    const std::string shown = m.id.size() > 64 ? printable(m.id.substr(0, 48)) + "...' (" +
                                                     std::to_string(m.id.size()) + " characters)"
                                               : printable(m.id) + "'";
    throw std::runtime_error(path + ": id '" + shown + " is not a valid op namespace");
  }
  return m;
}

void verify_metadata_digest(const KernelMetadata& m, const std::string& variant_dir,
                            const std::vector<std::string>& files) {
  if (!m.has_digest) return;
  if (m.digest_algorithm != "sha256" && m.digest_algorithm != "sha512") {
    throw std::runtime_error("metadata.json digest: unknown algorithm '" + m.digest_algorithm +
                             "'");
  }
  std::set<std::string> present;
  for (const auto& f : files) {
    if (!excluded(f)) present.insert(f);
  }
  for (const auto& [file, expected] : m.digest_files) {
    if (!present.count(file)) {
      throw std::runtime_error("metadata.json digest lists " + file + ", which is missing");
    }
    const std::string actual = digest_base64_file(variant_dir + "/" + file, m.digest_algorithm);
    if (actual != expected) {
      throw std::runtime_error("metadata.json digest mismatch for " + file + ": " + actual +
                               " != " + expected);
    }
  }
  for (const auto& f : present) {
    if (!m.digest_files.count(f)) {
      throw std::runtime_error("metadata.json digest does not list " + f + " (unknown file)");
    }
  }
}

}  // namespace libreyolo::kernels::hub
