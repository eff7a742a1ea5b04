#include "kernels/hub/metadata.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <stdexcept>

#include "kernels/hub/digest.h"

namespace libreyolo::kernels::hub {
namespace {

bool excluded(const std::string& file) {
  if (file == "metadata.json" || file == "metadata.json.sigstore") return true;
  if (file.find("__pycache__") != std::string::npos) return true;
  return file.size() >= 4 && file.compare(file.size() - 4, 4, ".pyc") == 0;
}

}  // namespace

KernelMetadata read_metadata(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
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
  static const std::regex identifier("^[A-Za-z_][A-Za-z0-9_]*$");
  if (!std::regex_match(m.id, identifier)) {
    throw std::runtime_error(path + ": id '" + m.id + "' is not a valid op namespace");
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
