#include "kernels/hub/fetch.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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

std::string api_url(const Connection& c, const std::string& repo_id, const std::string& rest) {
  return trimmed_endpoint(c) + "/api/kernels/" + escape_path(repo_id) + "/" + rest;
}

// The error for a failed request about `repo_id`. A 404 from the kernels API may mean that the
// repository is a model-type one (huggingface/kernels >= 0.14 asks for repo_type="kernel" only,
// docs/source/migration.md "0.14"): then one GET /api/models/<repo> tells, and the refusal says
// so.
HubError hub_failure(const Connection& c, const std::string& repo_id, const HttpError& e,
                     const std::string& category) {
  if (e.status == 404 && !c.offline) {
    bool model = false;
    try {
      http_get(trimmed_endpoint(c) + "/api/models/" + escape_path(repo_id), c.http);
      model = true;
    } catch (const HttpError&) {
    }
    if (model) {
      return HubError("model_repo",
                      repo_id + " is a model-type repository on " + trimmed_endpoint(c) +
                          "; only kernel-type repositories load (as huggingface/kernels since "
                          "0.14): publish it as a kernel repository (kernel-builder "
                          "build-and-upload --repo-type kernel)");
    }
  }
  return HubError(category, e.what());
}

bool is_hex(const std::string& s, size_t size) {
  if (s.size() != size) return false;
  for (char ch : s) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Files (regular files and links to them) under `dir`, relative to it, sorted.
void files_under(const std::string& dir, const std::string& rel, std::vector<std::string>& out) {
  DIR* d = ::opendir((rel.empty() ? dir : dir + "/" + rel).c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  for (const auto& n : names) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    struct stat st {};
    if (::stat((dir + "/" + r).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      files_under(dir, r, out);
    } else if (S_ISREG(st.st_mode)) {
      out.push_back(r);
    }
  }
}

// The content hash an upstream-format file is listed with: SHA-256 (LFS) or the git blob id.
std::string content_hash(const std::string& path, bool lfs) {
  return lfs ? sha256_hex_file(path) : git_blob_sha1_hex_file(path);
}

const char* hash_kind(bool lfs) { return lfs ? "sha256" : "git blob id"; }

void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to + ".incomplete", std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  out.close();
  if (!in || !out || std::rename((to + ".incomplete").c_str(), to.c_str()) != 0) {
    throw HubError("cache", "cannot copy " + from + " to " + to);
  }
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
// `authority` names where `expected` comes from in a mismatch message.
std::string fetch_blob(const Connection& c, const std::string& repo_id, const std::string& sha,
                       const std::string& path, const std::string& expected,
                       const std::string& authority = "kernels.lock says") {
  const std::string repo_dir = repo_cache_dir(c.cache_dir, repo_id);
  make_dirs(repo_dir + "/blobs");
  const std::string partial = repo_dir + "/blobs/" +
                              (expected.empty() ? "tmp-" + std::to_string(::getpid()) : expected) +
                              ".incomplete";
  if (expected.empty()) ::unlink(partial.c_str());  // unknown content: never resume a stranger
  try {
    http_download(file_url(c, repo_id, sha, path), partial, c.http);
  } catch (const HttpError& e) {
    throw hub_failure(c, repo_id, e, "download");
  }
  const std::string actual = sha256_hex_file(partial);
  if (!expected.empty() && actual != expected) {
    ::unlink(partial.c_str());
    throw HubError("digest", "downloaded " + path + " of " + repo_id + "@" + sha + " has sha256 " +
                                 actual + ", " + authority + " " + expected);
  }
  const std::string blob = repo_dir + "/blobs/" + actual;
  if (std::rename(partial.c_str(), blob.c_str()) != 0) {
    throw HubError("cache", "cannot rename " + partial + ": " + std::strerror(errno));
  }
  return actual;
}

// Downloads a non-LFS file into blobs/<git blob id> (huggingface_hub's name for it), verified.
void fetch_git_blob(const Connection& c, const std::string& repo_id, const std::string& sha,
                    const std::string& path, const std::string& blob_id) {
  const std::string repo_dir = repo_cache_dir(c.cache_dir, repo_id);
  make_dirs(repo_dir + "/blobs");
  const std::string partial = repo_dir + "/blobs/" + blob_id + ".incomplete";
  try {
    http_download(file_url(c, repo_id, sha, path), partial, c.http);
  } catch (const HttpError& e) {
    throw hub_failure(c, repo_id, e, "download");
  }
  const std::string actual = git_blob_sha1_hex_file(partial);
  if (actual != blob_id) {
    ::unlink(partial.c_str());
    throw HubError("digest", "downloaded " + path + " of " + repo_id + "@" + sha +
                                 " has git blob id " + actual + ", the Hub's tree lists " +
                                 blob_id);
  }
  const std::string blob = repo_dir + "/blobs/" + blob_id;
  if (std::rename(partial.c_str(), blob.c_str()) != 0) {
    throw HubError("cache", "cannot rename " + partial + ": " + std::strerror(errno));
  }
}

std::vector<TreeFile> list_tree(const Connection& c, const std::string& repo_id,
                                const std::string& sha, const std::string& sub) {
  const std::string url =
      api_url(c, repo_id, "tree/" + url_escape_segment(sha) + "/" + escape_path(sub)) +
      "?recursive=true";
  std::string body;
  try {
    body = http_get(url, c.http);
  } catch (const HttpError& e) {
    throw hub_failure(c, repo_id, e, "resolve");
  }
  std::vector<TreeFile> out;
  try {
    const auto j = nlohmann::json::parse(body);
    if (!j.is_array()) throw HubError("resolve", url + ": unexpected answer: not a list");
    for (const auto& e : j) {
      if (!e.is_object() || e.value("type", "") != "file") continue;
      const std::string path = e.at("path").get<std::string>();
      if (path.rfind("build/", 0) != 0) continue;
      const std::string rest = path.substr(6);
      const auto slash = rest.find('/');
      if (slash == std::string::npos) continue;
      TreeFile f;
      f.variant = rest.substr(0, slash);
      f.path = rest.substr(slash + 1);
      if (excluded_from_variant_hash(f.path)) continue;
      if (!is_safe_relative_path(f.path)) continue;
      if (e.contains("lfs") && e["lfs"].is_object() && e["lfs"].contains("oid")) {
        f.lfs_sha256 = e["lfs"]["oid"].get<std::string>();
      }
      if (e.contains("oid") && e["oid"].is_string()) f.blob_id = e["oid"].get<std::string>();
      out.push_back(std::move(f));
    }
  } catch (const nlohmann::json::exception& e) {
    throw HubError("resolve", url + ": unexpected answer: " + e.what());
  }
  return out;
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
  const std::string url = api_url(c, repo_id, "revision/" + url_escape_segment(revision));
  std::string body;
  try {
    body = http_get(url, c.http);
  } catch (const HttpError& e) {
    throw hub_failure(c, repo_id, e, "resolve");
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

std::string resolve_version(const Connection& c, const std::string& repo_id, int version) {
  const std::string name = "v" + std::to_string(version);
  if (c.offline) {
    // _versions.py _get_available_versions_from_cache: refs/v<N> in the cache.
    const std::string ref = repo_cache_dir(c.cache_dir, repo_id) + "/refs/" + name;
    std::ifstream in(ref);
    std::string sha;
    if (in >> sha && is_commit(sha)) return sha;
    throw HubError("offline", "Version " + std::to_string(version) + " of '" + repo_id +
                                  "' is not available in the local cache (" + ref +
                                  ") and offline mode is on");
  }
  const std::string url = api_url(c, repo_id, "refs");
  std::string body;
  try {
    body = http_get(url, c.http);
  } catch (const HttpError& e) {
    throw hub_failure(c, repo_id, e, "resolve");
  }
  std::map<int, std::string> versions;  // _versions.py: branches "v<int>"
  try {
    const auto j = nlohmann::json::parse(body);
    for (const auto& b : j.at("branches")) {
      const std::string bname = b.at("name").get<std::string>();
      if (bname.size() < 2 || bname[0] != 'v' || bname.size() > 10) continue;
      bool digits = true;
      for (size_t i = 1; i < bname.size(); ++i)
        digits = digits && std::isdigit(static_cast<unsigned char>(bname[i]));
      if (!digits) continue;
      versions[std::stoi(bname.substr(1))] = b.at("targetCommit").get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw HubError("resolve", url + ": unexpected answer: " + e.what());
  }
  auto it = versions.find(version);
  if (it == versions.end()) {
    std::string available;
    for (const auto& [v, commit] : versions) {
      available += (available.empty() ? "" : ", ") + std::to_string(v);
    }
    throw HubError("resolve", repo_id + ": Version " + std::to_string(version) +
                                  " not found, available versions: " + available);
  }
  if (!is_commit(it->second)) {
    throw HubError("resolve", url + ": branch " + name + " has no 40-hex targetCommit");
  }
  const int latest = versions.rbegin()->first;
  if (version < latest) {
    log::warn("hub: You are using version " + std::to_string(version) + " of '" + repo_id +
              "', but version " + std::to_string(latest) + " is available.");
  }
  return it->second;
}

std::vector<TreeFile> list_build_files(const Connection& c, const std::string& repo_id,
                                       const std::string& sha) {
  return list_tree(c, repo_id, sha, "build");
}

std::vector<TreeFile> list_variant_files(const Connection& c, const std::string& repo_id,
                                         const std::string& sha, const std::string& variant) {
  std::vector<TreeFile> out;
  for (auto& f : list_tree(c, repo_id, sha, "build/" + variant)) {
    if (f.variant == variant) out.push_back(std::move(f));
  }
  return out;
}

UpstreamVariant prepare_upstream_variant(const Connection& c, const LockEntry& entry,
                                         const std::string& variant) {
  auto v = entry.variants.find(variant);
  if (v == entry.variants.end() || v->second.hash.empty()) {
    throw HubError("unlocked", "variant " + variant + " of " + entry.repo_id +
                                   " has no git_lfs_concat hash in kernels.lock");
  }
  const std::string where = "build/" + variant + " of " + entry.repo_id + "@" + entry.sha;
  UpstreamVariant out;
  std::string source;
  if (!c.offline) {
    for (const auto& f : list_variant_files(c, entry.repo_id, entry.sha, variant)) {
      // locking.py: "Cannot get blob ID for <file>".
      if (f.upstream_hash().empty()) {
        throw HubError("resolve", "the Hub lists no blob id for build/" + variant + "/" + f.path +
                                      " of " + entry.repo_id + "@" + entry.sha);
      }
      out.files[f.path] = {f.upstream_hash(), !f.lfs_sha256.empty()};
    }
    source = "the Hub's file list";
  } else {
    const std::string dir = variant_cache_dir(c.cache_dir, entry.repo_id, entry.sha, variant);
    if (!exists(dir)) {
      throw HubError("offline", "offline mode and " + where + " is not in the cache " +
                                    c.cache_dir + " (prefetch it with `kernels download`)");
    }
    std::vector<std::string> names;
    files_under(dir, "", names);
    for (const auto& rel : names) {
      if (excluded_from_variant_hash(rel)) continue;
      const std::string path = dir + "/" + rel;
      char target[PATH_MAX];
      const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
      const std::string name =
          n > 0 ? basename_of(std::string(target, static_cast<size_t>(n))) : std::string();
      if (!is_hex(name, 40) && !is_hex(name, 64)) {
        throw HubError("offline", "cached " + path +
                                      " is not a link to a blob named by its hash: its git hash "
                                      "is unknown offline (prefetch it with `kernels download`)");
      }
      const bool lfs = name.size() == 64;
      const std::string actual = content_hash(path, lfs);
      if (actual != name) {
        throw HubError("digest", "cached " + path + " has " + hash_kind(lfs) + " " + actual +
                                     ", its blob name says " + name);
      }
      out.files[rel] = {name, lfs};
    }
    source = "the cached file list";
  }
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& [path, f] : out.files) pairs.emplace_back(path, f.hash);
  std::string computed;
  try {
    computed = git_lfs_concat_hash(pairs);
  } catch (const std::invalid_argument& e) {
    throw HubError("resolve", where + ": " + e.what());
  }
  if (computed != v->second.hash) {
    throw HubError("digest", where + ": " + source + " hashes to " + computed +
                                 ", kernels.lock says " + v->second.hash + " (git_lfs_concat)");
  }
  return out;
}

std::string ensure_upstream_file(const Connection& c, const LockEntry& entry,
                                 const std::string& variant, const UpstreamVariant& prepared,
                                 const std::string& file) {
  auto it = prepared.files.find(file);
  const std::string where =
      "build/" + variant + "/" + file + " of " + entry.repo_id + "@" + entry.sha;
  if (it == prepared.files.end()) {
    throw HubError("unlocked", where + " is not in the variant's file list");
  }
  const auto& [hash, lfs] = it->second;
  const std::string repo_dir = repo_cache_dir(c.cache_dir, entry.repo_id);
  const std::string path =
      variant_cache_dir(c.cache_dir, entry.repo_id, entry.sha, variant) + "/" + file;
  if (c.offline) {
    if (exists(path)) return path;  // verified by prepare_upstream_variant
    throw HubError("offline", "offline mode and " + where + " is not in the cache " + c.cache_dir +
                                  " (prefetch it with `kernels download`)");
  }
  const std::string blob = repo_dir + "/blobs/" + hash;
  if (exists(path)) {
    if (content_hash(path, lfs) == hash) {
      char target[PATH_MAX];
      const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
      if (n > 0 && basename_of(std::string(target, static_cast<size_t>(n))) == hash) return path;
      // Cached under another blob name (a libreyolo-format entry names blobs by SHA-256):
      // relink it under the name huggingface_hub gives it, so that offline checks work.
      make_dirs(repo_dir + "/blobs");
      if (!exists(blob)) copy_file(path, blob);
      link_blob(repo_dir, path, hash);
      return path;
    }
    log::info("hub: cached " + path + " does not match the Hub's tree, downloading it again");
  }
  if (exists(blob) && content_hash(blob, lfs) == hash) {
    link_blob(repo_dir, path, hash);
    return path;
  }
  if (lfs) {
    fetch_blob(c, entry.repo_id, entry.sha, "build/" + variant + "/" + file, hash,
               "the Hub's tree lists");
  } else {
    fetch_git_blob(c, entry.repo_id, entry.sha, "build/" + variant + "/" + file, hash);
  }
  link_blob(repo_dir, path, hash);
  return path;
}

LockEntry lock_repo(const Connection& c, const std::string& slot, const std::string& repo_id,
                    const std::string& revision, const std::vector<std::string>& variants,
                    LockFormat format, std::optional<int> version) {
  if (c.offline) throw HubError("offline", "`kernels lock` needs the network (offline mode is on)");
  LockEntry entry;
  entry.slot = slot;
  entry.repo_id = repo_id;
  entry.format = format;
  entry.version = version;
  if (version) {
    entry.revision = "v" + std::to_string(*version);
    entry.sha = resolve_version(c, repo_id, *version);
  } else {
    entry.revision = revision;
    entry.sha = resolve_revision(c, repo_id, revision);
  }
  const std::set<std::string> wanted(variants.begin(), variants.end());
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> hashes;
  std::set<std::string> unhashed;  // variants with a file the Hub lists no hash for
  for (const auto& f : list_build_files(c, repo_id, entry.sha)) {
    if (!wanted.empty()) {
      if (!wanted.count(f.variant)) continue;
    } else if (format == LockFormat::upstream) {
      if (f.variant.rfind("torch", 0) != 0) continue;  // locking.py: "build/torch*" only
    } else {
      auto v = parse_variant(f.variant);
      if (!v || (v->kind != Variant::Kind::torch && v->kind != Variant::Kind::stable_abi)) continue;
    }
    if (f.upstream_hash().empty()) {
      if (format == LockFormat::upstream) {
        throw HubError("resolve", "Cannot get blob ID for build/" + f.variant + "/" + f.path +
                                      " of " + repo_id + "@" + entry.sha);
      }
      unhashed.insert(f.variant);
    } else {
      hashes[f.variant].emplace_back(f.path, f.upstream_hash());
    }
    if (format == LockFormat::upstream) {
      entry.variants[f.variant];
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
  for (auto& [name, v] : entry.variants) {
    if (unhashed.count(name)) continue;
    try {
      v.hash = git_lfs_concat_hash(hashes[name]);
    } catch (const std::invalid_argument& e) {
      throw HubError("resolve",
                     "build/" + name + " of " + repo_id + "@" + entry.sha + ": " + e.what());
    }
  }
  for (const auto& v : wanted) {
    if (!entry.variants.count(v)) {
      throw HubError("resolve", "no build/" + v + " in " + repo_id + "@" + entry.sha);
    }
  }
  if (entry.variants.empty()) {
    throw HubError("resolve", "no loadable build variant in " + repo_id + "@" + entry.sha);
  }
  write_ref(c, repo_id, entry.revision, entry.sha);
  return entry;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  files_under(dir, "", out);
  std::sort(out.begin(), out.end());
  return out;
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
    if (v->second.upstream()) {
      const auto prepared = prepare_upstream_variant(c, entry, name);
      for (const auto& [file, f] : prepared.files)
        ensure_upstream_file(c, entry, name, prepared, file);
    } else {
      for (const auto& [file, digest] : v->second.files) ensure_file(c, entry, name, file);
    }
    out.push_back(variant_cache_dir(c.cache_dir, entry.repo_id, entry.sha, name));
  }
  write_ref(c, entry.repo_id, entry.revision, entry.sha);
  return out;
}

}  // namespace libreyolo::kernels::hub
