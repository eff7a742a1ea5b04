#include "kernels/hub/lock.h"

#include "kernels/policy.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace libreyolo::kernels::hub {
namespace {

bool is_variant_hash(const std::string& hash) {
  if (hash.size() != 7 + 64 || hash.rfind("sha256-", 0) != 0) return false;
  for (size_t i = 7; i < hash.size(); ++i) {
    const char c = hash[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

const char* lock_format_name(LockFormat format) {
  return format == LockFormat::upstream ? "upstream" : "libreyolo";
}

std::optional<LockFormat> parse_lock_format(const std::string& name) {
  if (name == "libreyolo") return LockFormat::libreyolo;
  if (name == "upstream") return LockFormat::upstream;
  return std::nullopt;
}

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

bool excluded_from_variant_hash(const std::string& path) {
  // locking.py: rfilename.endswith(".pyc") or "__pycache__" in rfilename.split("/")
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".pyc") == 0) return true;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "__pycache__") == 0) return true;
    start = end + 1;
  }
  return false;
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
    if (e.contains("version")) {
      const auto& v = e["version"];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000) {
        throw LockError(where + ": 'version' must be an integer major version (0 to 1000000)");
      }
      entry.version = static_cast<int>(v.get<int64_t>());
      if (entry.revision.empty()) entry.revision = "v" + std::to_string(*entry.version);
    }
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
        if (!v.is_object() || (!v.contains("files") && !v.contains("hash"))) {
          throw LockError(vw + ": needs 'files' {path: sha256} or 'hash' (kernels lock)");
        }
        if (v.contains("files")) {
          if (!v["files"].is_object()) throw LockError(vw + ": 'files' must be {path: sha256}");
          for (const auto& [file, digest] : v["files"].items()) {
            if (!is_safe_relative_path(file))
              throw LockError(vw + ": unsafe file name '" + printable(file) + "'");
            if (!digest.is_string())
              throw LockError(vw + ": digest of '" + printable(file) + "' must be a string");
            std::string d = digest.get<std::string>();
            if (d.rfind("sha256:", 0) == 0) d = d.substr(7);
            lv.files[file] = d;
          }
        }
        if (v.contains("hash")) {
          // huggingface/kernels locking.py VariantLock: hash, hash_type = "git_lfs_concat".
          if (!v["hash"].is_string() || !is_variant_hash(v["hash"].get<std::string>())) {
            throw LockError(vw + ": 'hash' must be \"sha256-<64 hex>\"");
          }
          lv.hash = v["hash"].get<std::string>();
          if (v.contains("hash_type")) {
            if (!v["hash_type"].is_string() ||
                v["hash_type"].get<std::string>() != "git_lfs_concat") {
              throw LockError(vw + ": unknown 'hash_type' " + printable(v["hash_type"].dump()) +
                              " (only \"git_lfs_concat\")");
            }
          }
          if (lv.files.empty()) entry.format = LockFormat::upstream;
        }
        entry.variants[name] = std::move(lv);
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::string lock_text(const std::vector<LockEntry>& entries, LockFormat format) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const auto& e : entries) {
    nlohmann::ordered_json je;
    je["repo_id"] = e.repo_id;
    if (format == LockFormat::upstream) {
      // locking.py KernelLock(repo_id, sha, variants) through dataclasses.asdict.
      je["sha"] = e.sha;
      je["variants"] = nlohmann::ordered_json::object();
      for (const auto& [name, v] : e.variants) {
        if (v.hash.empty()) {
          throw std::runtime_error(e.repo_id + " variant " + name +
                                   " has no git_lfs_concat hash: lock it again with --format "
                                   "upstream");
        }
        je["variants"][name] = {{"hash", v.hash}, {"hash_type", "git_lfs_concat"}};
      }
      j.push_back(je);
      continue;
    }
    je["revision"] = e.revision;
    if (e.version) je["version"] = *e.version;
    je["sha"] = e.sha;
    je["slot"] = e.slot;
    je["variants"] = nlohmann::ordered_json::object();
    for (const auto& [name, v] : e.variants) {
      nlohmann::ordered_json files = nlohmann::ordered_json::object();
      for (const auto& [f, d] : v.files) files[f] = d;
      je["variants"][name]["files"] = files;
      if (!v.hash.empty() && v.files.empty()) je["variants"][name]["hash"] = v.hash;
    }
    j.push_back(je);
  }
  // Python's json.dump(indent=2): ", " / ": " separators, ensure_ascii, no final newline.
  if (format == LockFormat::upstream) return j.dump(2, ' ', true);
  return j.dump(2) + "\n";
}

void write_lock_file(const std::string& path, const std::vector<LockEntry>& entries,
                     LockFormat format) {
  const std::string text = lock_text(entries, format);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    if (!out) throw std::runtime_error(tmp + ": cannot write");
    out << text;
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

std::map<std::string, std::string> parse_local_kernels(const std::string& value) {
  std::map<std::string, std::string> out;
  if (value.empty()) return out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(':', start);
    if (end == std::string::npos) end = value.size();
    const std::string entry = value.substr(start, end - start);
    start = end + 1;
    const auto eq = entry.find('=');
    if (eq == std::string::npos) {
      throw LocalKernelsError("Invalid LOCAL_KERNELS entry: " + printable(entry) +
                              ". Expected format: repo_id_1=path_1:repo_id_2=path_2");
    }
    const std::string repo_id = entry.substr(0, eq), path = entry.substr(eq + 1);
    if (repo_id.find('/') == std::string::npos || !is_safe_relative_path(repo_id)) {
      throw LocalKernelsError("Invalid LOCAL_KERNELS entry: " + printable(entry) + ". '" +
                              printable(repo_id) + "' is not <org>/<name>");
    }
    if (path.empty()) {
      throw LocalKernelsError("Invalid LOCAL_KERNELS entry: " + printable(entry) +
                              ". The path is empty");
    }
    out[repo_id] = path;
  }
  return out;
}

}  // namespace libreyolo::kernels::hub
