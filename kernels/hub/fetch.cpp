#include "kernels/hub/fetch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/hub/digest.h"
#include "log/log.h"

namespace libreyolo::kernels::hub {
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool link_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void make_dirs(const std::string& path) {
  std::string cur;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    cur = path.substr(0, end);
    start = end + 1;
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      throw HubError("cache", "cannot create " + cur + ": " + std::strerror(errno));
    }
  }
}

std::string dirname(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string escape_path(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (!out.empty() || start > 0) out += '/';
    out += url_escape_segment(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string trimmed_endpoint(const Connection& c) {
  std::string e = c.endpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

std::string file_url(const Connection& c, const std::string& repo_id, const std::string& sha,
                     const std::string& path) {
  return trimmed_endpoint(c) + "/kernels/" + escape_path(repo_id) + "/resolve/" +
         url_escape_segment(sha) + "/" + escape_path(path);
}

// Links snapshots/<sha>/build/<variant>/<file> to blobs/<digest> (relative, as huggingface_hub).
void link_blob(const std::string& repo_dir, const std::string& snapshot_file,
               const std::string& digest) {
  make_dirs(dirname(snapshot_file));
  // snapshot_file = repo_dir + "/snapshots/<sha>/<path>": one "../" per directory below repo_dir.
  const std::string rel_path = snapshot_file.substr(repo_dir.size() + 1);
  std::string up;
  for (char c : rel_path) {
    if (c == '/') up += "../";
  }
  if (link_exists(snapshot_file)) ::unlink(snapshot_file.c_str());
  if (::symlink((up + "blobs/" + digest).c_str(), snapshot_file.c_str()) != 0) {
    throw HubError("cache", "cannot link " + snapshot_file + ": " + std::strerror(errno));
  }
}

// Downloads `path` of repo@sha into blobs/; returns the content's SHA-256 (the blob's name).
std::string fetch_blob(const Connection& c, const std::string& repo_id, const std::string& sha,
                       const std::string& path, const std::string& expected) {
  const std::string repo_dir = repo_cache_dir(c.cache_dir, repo_id);
  make_dirs(repo_dir + "/blobs");
  const std::string partial = repo_dir + "/blobs/" +
                              (expected.empty() ? "tmp-" + std::to_string(::getpid()) : expected) +
                              ".incomplete";
  if (expected.empty()) ::unlink(partial.c_str());  // unknown content: never resume a stranger
  try {
    http_download(file_url(c, repo_id, sha, path), partial, c.http);
  } catch (const HttpError& e) {
    throw HubError("download", e.what());
  }
  const std::string actual = sha256_hex_file(partial);
  if (!expected.empty() && actual != expected) {
    ::unlink(partial.c_str());
    throw HubError("digest", "downloaded " + path + " of " + repo_id + "@" + sha + " has sha256 " +
                                 actual + ", kernels.lock says " + expected);
  }
  const std::string blob = repo_dir + "/blobs/" + actual;
  if (std::rename(partial.c_str(), blob.c_str()) != 0) {
    throw HubError("cache", "cannot rename " + partial + ": " + std::strerror(errno));
  }
  return actual;
}

void write_ref(const Connection& c, const std::string& repo_id, const std::string& revision,
               const std::string& sha) {
  if (revision.empty() || revision == sha || !is_safe_relative_path(revision)) return;
  const std::string path = repo_cache_dir(c.cache_dir, repo_id) + "/refs/" + revision;
  make_dirs(dirname(path));
  std::ofstream(path, std::ios::trunc) << sha;
}

}  // namespace

Connection connection_for(const HubSettings& settings) {
  Connection c;
  c.endpoint = settings.endpoint.value;
  c.cache_dir = default_cache_dir(settings.cache_dir.value, settings.fallback_cache_dir);
  c.offline = settings.offline.value;
  c.http.token = settings.token;
  c.http.retries = settings.retries;
  const double timeout = settings.timeout_seconds.value;
  c.http.connect_timeout_seconds = std::min(10.0, timeout);
  c.http.deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(timeout));
  return c;
}

std::string default_cache_dir(const std::string& configured, const std::string& fallback) {
  return configured.empty() ? fallback : configured;
}

std::string repo_cache_dir(const std::string& cache_dir, const std::string& repo_id) {
  std::string folder = "kernels--" + repo_id;
  for (size_t pos = 0; (pos = folder.find('/', pos)) != std::string::npos;) {
    folder.replace(pos, 1, "--");
  }
  return cache_dir + "/" + folder;
}

std::string variant_cache_dir(const std::string& cache_dir, const std::string& repo_id,
                              const std::string& sha, const std::string& variant) {
  return repo_cache_dir(cache_dir, repo_id) + "/snapshots/" + sha + "/build/" + variant;
}

std::string ensure_file(const Connection& c, const LockEntry& entry, const std::string& variant,
                        const std::string& file) {
  auto v = entry.variants.find(variant);
  if (v == entry.variants.end() || !v->second.files.count(file)) {
    throw HubError("unlocked", "build/" + variant + "/" + file + " of " + entry.repo_id + "@" +
                                   entry.sha + " is not in kernels.lock");
  }
  const std::string expected = v->second.files.at(file);
  const std::string repo_dir = repo_cache_dir(c.cache_dir, entry.repo_id);
  const std::string path =
      variant_cache_dir(c.cache_dir, entry.repo_id, entry.sha, variant) + "/" + file;
  if (exists(path)) {
    const std::string actual = sha256_hex_file(path);
    if (actual == expected) return path;
    if (c.offline) {
      throw HubError(
          "digest", "cached " + path + " has sha256 " + actual + ", kernels.lock says " + expected);
    }
    log::info("hub: cached " + path + " does not match kernels.lock, downloading it again");
  }
  const std::string blob = repo_dir + "/blobs/" + expected;
  if (exists(blob) && sha256_hex_file(blob) == expected) {
    link_blob(repo_dir, path, expected);
    return path;
  }
  if (c.offline) {
    throw HubError("offline", "offline mode and build/" + variant + "/" + file + " of " +
                                  entry.repo_id + "@" + entry.sha + " is not in the cache " +
                                  c.cache_dir + " (prefetch it with `kernels download`)");
  }
  fetch_blob(c, entry.repo_id, entry.sha, "build/" + variant + "/" + file, expected);
  link_blob(repo_dir, path, expected);
  return path;
}

std::string resolve_revision(const Connection& c, const std::string& repo_id,
                             const std::string& revision) {
  if (c.offline) {
    const std::string ref = repo_cache_dir(c.cache_dir, repo_id) + "/refs/" + revision;
    std::ifstream in(ref);
    std::string sha;
    if (in >> sha && is_commit(sha)) return sha;
    if (is_commit(revision)) return revision;
    throw HubError("offline", "offline mode and no cached ref " + ref);
  }
  const std::string url = trimmed_endpoint(c) + "/api/kernels/" + escape_path(repo_id) +
                          "/revision/" + url_escape_segment(revision);
  std::string body;
  try {
    body = http_get(url, c.http);
  } catch (const HttpError& e) {
    throw HubError("resolve", e.what());
  }
  try {
    const auto j = nlohmann::json::parse(body);
    const std::string sha = j.at("sha").get<std::string>();
    if (!is_commit(sha)) throw HubError("resolve", url + ": 'sha' is not a 40-hex commit");
    return sha;
  } catch (const nlohmann::json::exception& e) {
    throw HubError("resolve", url + ": unexpected answer: " + e.what());
  }
}

std::vector<TreeFile> list_build_files(const Connection& c, const std::string& repo_id,
                                       const std::string& sha) {
  const std::string url = trimmed_endpoint(c) + "/api/kernels/" + escape_path(repo_id) + "/tree/" +
                          url_escape_segment(sha) + "/build?recursive=true";
  std::string body;
  try {
    body = http_get(url, c.http);
  } catch (const HttpError& e) {
    throw HubError("resolve", e.what());
  }
  std::vector<TreeFile> out;
  try {
    const auto j = nlohmann::json::parse(body);
    for (const auto& e : j) {
      if (e.value("type", "") != "file") continue;
      const std::string path = e.at("path").get<std::string>();
      if (path.rfind("build/", 0) != 0) continue;
      const std::string rest = path.substr(6);
      const auto slash = rest.find('/');
      if (slash == std::string::npos) continue;
      TreeFile f;
      f.variant = rest.substr(0, slash);
      f.path = rest.substr(slash + 1);
      if (f.path.size() >= 4 && f.path.compare(f.path.size() - 4, 4, ".pyc") == 0) continue;
      if (f.path.find("__pycache__") != std::string::npos) continue;
      if (!is_safe_relative_path(f.path)) continue;
      if (e.contains("lfs") && e["lfs"].is_object() && e["lfs"].contains("oid")) {
        f.lfs_sha256 = e["lfs"]["oid"].get<std::string>();
      }
      out.push_back(std::move(f));
    }
  } catch (const nlohmann::json::exception& e) {
    throw HubError("resolve", url + ": unexpected answer: " + e.what());
  }
  return out;
}

LockEntry lock_repo(const Connection& c, const std::string& slot, const std::string& repo_id,
                    const std::string& revision, const std::vector<std::string>& variants) {
  if (c.offline) throw HubError("offline", "`kernels lock` needs the network (offline mode is on)");
  LockEntry entry;
  entry.slot = slot;
  entry.repo_id = repo_id;
  entry.revision = revision;
  entry.sha = resolve_revision(c, repo_id, revision);
  const std::set<std::string> wanted(variants.begin(), variants.end());
  for (const auto& f : list_build_files(c, repo_id, entry.sha)) {
    if (wanted.empty()) {
      auto v = parse_variant(f.variant);
      if (!v || (v->kind != Variant::Kind::torch && v->kind != Variant::Kind::stable_abi)) continue;
    } else if (!wanted.count(f.variant)) {
      continue;
    }
    std::string digest = f.lfs_sha256;
    if (digest.size() != 64) {
      digest = fetch_blob(c, repo_id, entry.sha, "build/" + f.variant + "/" + f.path, "");
      link_blob(repo_cache_dir(c.cache_dir, repo_id),
                variant_cache_dir(c.cache_dir, repo_id, entry.sha, f.variant) + "/" + f.path,
                digest);
    }
    entry.variants[f.variant].files[f.path] = digest;
  }
  for (const auto& v : wanted) {
    if (!entry.variants.count(v)) {
      throw HubError("resolve", "no build/" + v + " in " + repo_id + "@" + entry.sha);
    }
  }
  if (entry.variants.empty()) {
    throw HubError("resolve", "no loadable build variant in " + repo_id + "@" + entry.sha);
  }
  write_ref(c, repo_id, revision, entry.sha);
  return entry;
}

std::vector<std::string> download_locked(const Connection& c, const LockEntry& entry,
                                         const std::vector<std::string>& variants) {
  if (!is_commit(entry.sha)) {
    throw HubError("unpinned", entry.repo_id + ": sha '" + entry.sha + "' is not a 40-hex commit");
  }
  std::vector<std::string> names = variants;
  if (names.empty()) {
    for (const auto& [name, v] : entry.variants) names.push_back(name);
  }
  std::vector<std::string> out;
  for (const auto& name : names) {
    auto v = entry.variants.find(name);
    if (v == entry.variants.end()) {
      throw HubError("unlocked",
                     "variant " + name + " of " + entry.repo_id + " is not in kernels.lock");
    }
    for (const auto& [file, digest] : v->second.files) ensure_file(c, entry, name, file);
    out.push_back(variant_cache_dir(c.cache_dir, entry.repo_id, entry.sha, name));
  }
  write_ref(c, entry.repo_id, entry.revision, entry.sha);
  return out;
}

}  // namespace libreyolo::kernels::hub
