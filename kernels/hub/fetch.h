// Hub access for the provider and the lock/download commands: the HF-compatible endpoint's URL
// scheme, the cache laid out like the huggingface_hub cache, and the `kernels lock` /
// `kernels download` operations (library functions; tools/hub and the server expose them).
//
// URL scheme (endpoint = https://huggingface.co by default, HF_ENDPOINT):
//   GET /api/kernels/<org>/<name>/revision/<revision>        -> {"sha": "<commit>", ...}
//   GET /api/kernels/<org>/<name>/refs                       -> {"branches": [{"name": "v1",
//                                                                "targetCommit": "<commit>"}]}
//   GET /api/kernels/<org>/<name>/tree/<commit>/build[/<variant>]?recursive=true
//                                                            ->
//                                                            [{"type","path","size","oid","lfs"}]
//   GET /kernels/<org>/<name>/resolve/<commit>/<path>        -> the file
//   GET /api/models/<org>/<name>  (only after a 404 above: is it a model-type repository?)
// Cache (huggingface_hub layout, hf-kernels-hub.md section 2.3):
//   <cache>/kernels--<org>--<name>/blobs/<sha256>   (libreyolo-format entries; upstream-format
//   entries name blobs like huggingface_hub: LFS SHA-256 or, for other files, the git blob id)
//   <cache>/kernels--<org>--<name>/snapshots/<commit>/build/<variant>/<file> ->
//   ../../..../blobs/<sha256> <cache>/kernels--<org>--<name>/refs/<revision>  (the commit a branch
//   resolved to)
#pragma once

#include <map>
#include <optional>
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
/// "resolve" ("offline" when offline; "model_repo" for a model-type repository).
std::string resolve_revision(const Connection& connection, const std::string& repo_id,
                             const std::string& revision);

/// The commit of the `v<version>` branch of `repo_id`, from the Hub's refs list
/// (huggingface/kernels _versions.py resolve_version_spec_as_ref: branches named "v<int>"); warns
/// when a higher version exists. Offline: the cache's refs/v<version>. Throws HubError "resolve"
/// ("<repo>: Version N not found, available versions: 1, 2"), "offline", "model_repo".
std::string resolve_version(const Connection& connection, const std::string& repo_id, int version);

/// One file under build/ as listed by the tree API.
struct TreeFile {
  std::string variant;     ///< first directory under build/
  std::string path;        ///< relative to build/<variant>/
  std::string lfs_sha256;  ///< SHA-256 of the content when the file is LFS-tracked, else ""
  std::string blob_id;     ///< the git blob id (`oid`, 40 hex), "" when not listed
  /// The hash upstream's git_lfs_concat takes for the file: lfs_sha256, else blob_id.
  const std::string& upstream_hash() const { return lfs_sha256.empty() ? blob_id : lfs_sha256; }
};

/// Every file under build/ at `sha` (skipped: *.pyc and __pycache__/, as upstream's
/// excluded_from_variant_hash). Throws HubError "resolve" ("model_repo").
std::vector<TreeFile> list_build_files(const Connection& connection, const std::string& repo_id,
                                       const std::string& sha);

/// Every file under build/<variant>/ at `sha` (the same skips). Throws HubError "resolve"
/// ("model_repo").
std::vector<TreeFile> list_variant_files(const Connection& connection, const std::string& repo_id,
                                         const std::string& sha, const std::string& variant);

/// `kernels lock`: resolves `version` (the v<N> branch, through the refs list) or else
/// `revision` to a commit and locks the variants named in `variants`. libreyolo format: records
/// the SHA-256 of every file (all classic-Torch and stable-ABI variants when `variants` is
/// empty; LFS files take the Hub's SHA-256, other files are downloaded into the cache and hashed).
/// upstream format: records each variant's git_lfs_concat hash from the tree listing alone, no
/// download (all variants named torch* when empty, as locking.py). Writes refs/<revision> in the
/// cache. Throws HubError.
LockEntry lock_repo(const Connection& connection, const std::string& slot,
                    const std::string& repo_id, const std::string& revision,
                    const std::vector<std::string>& variants = {},
                    LockFormat format = LockFormat::libreyolo,
                    std::optional<int> version = std::nullopt);

/// The files of one upstream-format variant (LockedVariant::upstream()), checked against its
/// git_lfs_concat hash: online from the tree listing of build/<variant> at entry.sha, offline
/// from the cache's snapshot links (their blob names are the files' hashes, as huggingface_hub
/// names blobs). Path relative to build/<variant>/ -> (hash, LFS or not).
struct UpstreamVariant {
  struct File {
    std::string hash;  ///< LFS SHA-256 (64 hex) or git blob id (40 hex)
    bool lfs = false;
  };
  std::map<std::string, File> files;
};

/// Lists and checks build/<variant> of an upstream-format `entry`. Throws HubError "digest"
/// ("build/<v> of <repo>@<sha>: the Hub's file list hashes to sha256-X, kernels.lock says
/// sha256-Y"), "offline" (not cached), "resolve", "model_repo", "unlocked" (variant not in the
/// lock or not upstream-format).
UpstreamVariant prepare_upstream_variant(const Connection& connection, const LockEntry& entry,
                                         const std::string& variant);

/// Makes `file` of a prepared upstream variant present in the cache, its content verified
/// against its listed hash (SHA-256 for LFS files, the git blob id otherwise); returns its path.
/// Throws HubError "digest" ("downloaded build/<v>/<f> of <repo>@<sha> has git blob id X, the
/// Hub's tree lists Y"), "download", "offline", "unlocked" (a file not in the listing).
std::string ensure_upstream_file(const Connection& connection, const LockEntry& entry,
                                 const std::string& variant, const UpstreamVariant& prepared,
                                 const std::string& file);

/// Regular files under `dir` (links followed), as sorted paths relative to it; empty when `dir`
/// cannot be read.
std::vector<std::string> files_in(const std::string& dir);

/// `kernels download`: fetches every file of the given variants of `entry` (all locked
/// variants when empty) into the cache, verified. Returns the variant folders. Throws HubError.
std::vector<std::string> download_locked(const Connection& connection, const LockEntry& entry,
                                         const std::vector<std::string>& variants = {});

}  // namespace libreyolo::kernels::hub
