// Hub access for the provider and the lock/download commands: the HF-compatible endpoint's URL
// scheme, the cache laid out like the huggingface_hub cache, and the `kernels lock` /
// `kernels download` operations (library functions; tools/hub and the server expose them).
//
// URL scheme (endpoint = https://huggingface.co by default, HF_ENDPOINT):
//   GET /api/kernels/<org>/<name>/revision/<revision>        -> {"sha": "<commit>", ...}
//   GET /api/kernels/<org>/<name>/tree/<commit>/build?recursive=true
//                                                            -> [{"type","path","size","lfs"}]
//   GET /kernels/<org>/<name>/resolve/<commit>/<path>        -> the file
// Cache (huggingface_hub layout, hf-kernels-hub.md section 2.3):
//   <cache>/kernels--<org>--<name>/blobs/<sha256>
//   <cache>/kernels--<org>--<name>/snapshots/<commit>/build/<variant>/<file> ->
//   ../../..../blobs/<sha256> <cache>/kernels--<org>--<name>/refs/<revision>  (the commit a branch
//   resolved to)
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/hub/http.h"
#include "kernels/hub/lock.h"
#include "kernels/hub/variant.h"

namespace libreyolo::kernels::hub {

/// Where and how to reach the Hub and the cache.
struct Connection {
  std::string endpoint = "https://huggingface.co";  ///< no trailing slash needed
  std::string cache_dir;                            ///< see default_cache_dir
  bool offline = false;                             ///< cache only: no request at all
  HttpOptions http;
};

/// The connection `settings` mean: endpoint, cache (default_cache_dir), offline, HF_TOKEN,
/// retries, and a deadline of `timeout_seconds` from now for all requests together.
Connection connection_for(const HubSettings& settings);

/// A failure of the hub provider or commands. `category` is a short stable word for metrics
/// and tests: "offline", "download", "digest", "resolve", "metadata", ...
class HubError : public std::runtime_error {
 public:
  HubError(std::string category, const std::string& what)
      : std::runtime_error(category + ": " + what), category(std::move(category)) {}
  std::string category;
};

/// `configured` when not empty (kernels.hub.cache_dir, KERNELS_CACHE, HF_HUB_CACHE), else
/// `fallback` (HubSettings::fallback_cache_dir: $HF_HOME/hub, else
/// $HOME/.cache/huggingface/hub, the huggingface_hub default, read with the policy).
std::string default_cache_dir(const std::string& configured, const std::string& fallback);

/// <cache>/kernels--<org>--<name>
std::string repo_cache_dir(const std::string& cache_dir, const std::string& repo_id);

/// <cache>/kernels--<org>--<name>/snapshots/<sha>/build/<variant>
std::string variant_cache_dir(const std::string& cache_dir, const std::string& repo_id,
                              const std::string& sha, const std::string& variant);

/// Makes build/<variant>/<file> of `entry` present in the cache with its locked SHA-256 and
/// returns its path. Cached and matching: no request. Otherwise downloads it (resumable, into
/// blobs/<sha256>.incomplete) unless offline. Throws HubError "offline" (not cached), "digest"
/// (cached or downloaded bytes differ from kernels.lock), "download", "unlocked" (file not in
/// the lock).
std::string ensure_file(const Connection& connection, const LockEntry& entry,
                        const std::string& variant, const std::string& file);

/// The commit `revision` (branch, tag or commit) of `repo_id` points to. Throws HubError
/// "resolve" ("offline" when offline).
std::string resolve_revision(const Connection& connection, const std::string& repo_id,
                             const std::string& revision);

/// One file under build/ as listed by the tree API.
struct TreeFile {
  std::string variant;     ///< first directory under build/
  std::string path;        ///< relative to build/<variant>/
  std::string lfs_sha256;  ///< SHA-256 of the content when the file is LFS-tracked, else ""
};

/// Every file under build/ at `sha` (*.pyc and __pycache__ skipped). Throws HubError "resolve".
std::vector<TreeFile> list_build_files(const Connection& connection, const std::string& repo_id,
                                       const std::string& sha);

/// `kernels lock`: resolves `revision` to a commit and records the SHA-256 of every file of
/// every variant whose name is in `variants` (all classic-Torch and stable-ABI variants when
/// empty). LFS files take the Hub's SHA-256; other files are downloaded into the cache and
/// hashed. Writes refs/<revision> in the cache. Throws HubError.
LockEntry lock_repo(const Connection& connection, const std::string& slot,
                    const std::string& repo_id, const std::string& revision,
                    const std::vector<std::string>& variants = {});

/// `kernels download`: fetches every file of the given variants of `entry` (all locked
/// variants when empty) into the cache, verified. Returns the variant folders. Throws HubError.
std::vector<std::string> download_locked(const Connection& connection, const LockEntry& entry,
                                         const std::vector<std::string>& variants = {});

}  // namespace libreyolo::kernels::hub
