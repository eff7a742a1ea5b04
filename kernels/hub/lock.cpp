#include "kernels/hub/lock.h"

#include "kernels/policy.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace libreyolo::kernels::hub {

bool is_commit(const std::string& revision) {
  if (revision.size() != 40) return false;
  for (char c : revision) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool is_safe_relative_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return path.find('\0') == std::string::npos;
}

std::vector<LockEntry> read_lock_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw LockError(path + ": cannot read the lock file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_lock_text(text.str(), path);
}

std::vector<LockEntry> parse_lock_text(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw LockError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_array()) throw LockError(path + ": the lock file must be a JSON list of entries");
  std::vector<LockEntry> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    const std::string where = path + ": entry " + std::to_string(i);
    if (!e.is_object()) throw LockError(where + ": must be an object");
    auto str = [&](const char* key, bool required) -> std::string {
      if (!e.contains(key)) {
        if (required) throw LockError(where + ": missing key '" + key + "'");
        return "";
      }
      if (!e[key].is_string()) throw LockError(where + ": '" + key + "' must be a string");
      return e[key].get<std::string>();
    };
    LockEntry entry;
    entry.repo_id = str("repo_id", true);
    entry.sha = str("sha", false);
    entry.revision = str("revision", false);
    if (e.contains("slot")) entry.slot = str("slot", true);
    if (entry.repo_id.find('/') == std::string::npos || !is_safe_relative_path(entry.repo_id)) {
      throw LockError(where + ": repo_id '" + printable(entry.repo_id) + "' is not <org>/<name>");
    }
    if (e.contains("variants")) {
      const auto& vs = e["variants"];
      if (!vs.is_object()) throw LockError(where + ": 'variants' must be an object");
      for (const auto& [name, v] : vs.items()) {
        // Names are echoed with control characters as \xNN: an error is one log line (a JSON
        // escape can put a newline into a key: hub_lock_fuzz; docs/FUZZING.md "Findings").
        const std::string vw = where + ": variant '" + printable(name) + "'";
        if (!is_safe_relative_path(name) || name.find('/') != std::string::npos) {
          throw LockError(vw + ": not a directory name");
        }
        LockedVariant lv;
        if (!v.is_object() || !v.contains("files") || !v["files"].is_object()) {
          throw LockError(vw + ": needs 'files' {path: sha256}");
        }
        for (const auto& [file, digest] : v["files"].items()) {
          if (!is_safe_relative_path(file))
            throw LockError(vw + ": unsafe file name '" + printable(file) + "'");
          if (!digest.is_string())
            throw LockError(vw + ": digest of '" + printable(file) + "' must be a string");
          std::string d = digest.get<std::string>();
          if (d.rfind("sha256:", 0) == 0) d = d.substr(7);
          lv.files[file] = d;
        }
        entry.variants[name] = std::move(lv);
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

void write_lock_file(const std::string& path, const std::vector<LockEntry>& entries) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const auto& e : entries) {
    nlohmann::ordered_json je;
    je["repo_id"] = e.repo_id;
    je["revision"] = e.revision;
    je["sha"] = e.sha;
    je["slot"] = e.slot;
    je["variants"] = nlohmann::ordered_json::object();
    for (const auto& [name, v] : e.variants) {
      nlohmann::ordered_json files = nlohmann::ordered_json::object();
      for (const auto& [f, d] : v.files) files[f] = d;
      je["variants"][name]["files"] = files;
    }
    j.push_back(je);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot write");
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + tmp + " to " + path);
  }
}

void upsert(std::vector<LockEntry>& entries, const LockEntry& entry) {
  for (auto& e : entries) {
    if (e.slot == entry.slot && e.repo_id == entry.repo_id) {
      e = entry;
      return;
    }
  }
  entries.push_back(entry);
}

std::string lock_file_path(const HubSettings& settings) {
  if (!settings.lock_file.value.empty()) return settings.lock_file.value;
  if (settings.config_file.empty()) return "";
  const auto slash = settings.config_file.rfind('/');
  return (slash == std::string::npos ? std::string() : settings.config_file.substr(0, slash + 1)) +
         "kernels.lock";
}

}  // namespace libreyolo::kernels::hub
