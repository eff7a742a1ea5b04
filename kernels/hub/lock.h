// kernels.lock: the pin of every hub kernel this process may load. JSON, a list of entries, read
// in either of two formats (per variant; both may be mixed in one file):
//
// libreyolo (written by default): like huggingface/kernels' `kernels lock` output with per-file
// SHA-256 digests, the slot the kernel fills and the revision asked for:
//
//   [{"repo_id": "kernels-community/deformable-detr", "revision": "v1", "version": 1,
//     "sha": "<40 hex>", "slot": "ms_deform_attn",
//     "variants": {"torch211-cxx11-cu128-x86_64-linux":
//                    {"files": {"metadata.json": "<sha256 hex>", "_x.abi3.so": "<sha256 hex>"}}}}]
//
// upstream (what `kernels lock` of huggingface/kernels writes, kernels/src/kernels/locking.py
// KernelLock/VariantLock): one hash per variant over the Hub's file list (git_lfs_concat_hash in
// kernels/hub/digest.h); such an entry fills the slot "ms_deform_attn":
//
//   [{"repo_id": "kernels-community/deformable-detr", "sha": "<40 hex>",
//     "variants": {"torch211-cxx11-cu128-x86_64-linux":
//                    {"hash": "sha256-<64 hex>", "hash_type": "git_lfs_concat"}}}]
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/policy.h"

namespace libreyolo::kernels::hub {

/// The two kernels.lock formats (see the top of this file).
enum class LockFormat {
  libreyolo,  ///< per-file SHA-256 digests, slot, revision (this daemon's)
  upstream,   ///< one git_lfs_concat hash per variant (huggingface/kernels `kernels lock`)
};

/// "libreyolo" | "upstream".
const char* lock_format_name(LockFormat format);

/// Parses "libreyolo" | "upstream"; std::nullopt for anything else.
std::optional<LockFormat> parse_lock_format(const std::string& name);

/// One locked variant: per-file digests (libreyolo format), a git_lfs_concat hash (upstream
/// format), or both.
struct LockedVariant {
  /// Path relative to build/<variant>/ -> lower-case hex SHA-256 (libreyolo format).
  std::map<std::string, std::string> files;
  /// "sha256-<64 lower-case hex>" over the variant's Hub file list (upstream format), or "".
  std::string hash;
  /// True when only `hash` pins the variant (it is verified against the Hub's tree listing).
  bool upstream() const { return files.empty() && !hash.empty(); }
};

/// One locked kernel repository.
struct LockEntry {
  std::string slot = "ms_deform_attn";  ///< registry slot the kernel implements
  std::string repo_id;                  ///< "org/name"
  std::string revision;                 ///< what was asked for ("v1", "main", a commit)
  /// The major version asked for (`--version N`, key "version"): resolved to the commit of the
  /// `v<N>` branch of the Hub's refs list, as huggingface/kernels _versions.py does.
  std::optional<int> version;
  std::string sha;  ///< the commit it resolved to: 40 lower-case hex
  std::map<std::string, LockedVariant> variants;
  LockFormat format = LockFormat::libreyolo;  ///< upstream when read from an upstream entry
};

/// A malformed lock file; what() names the file, the entry and the key.
class LockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// True for exactly 40 lower-case hex digits (a full git commit id).
bool is_commit(const std::string& revision);

/// True for a relative path without "..", empty or absolute components (lock file names are
/// joined to cache folders).
bool is_safe_relative_path(const std::string& path);

/// True for a file upstream leaves out of a variant's `git_lfs_concat` hash: a path ending in
/// ".pyc" or with a component equal to "__pycache__" (huggingface/kernels
/// kernels/src/kernels/locking.py, get_kernel_locks).
bool excluded_from_variant_hash(const std::string& path);

/// Reads `path`, in either format. Throws LockError (unreadable file, not JSON, wrong types,
/// unsafe file names, a variant with neither `files` nor `hash`, a `hash` that is not
/// "sha256-<64 hex>", a `hash_type` other than "git_lfs_concat", a `version` that is not an
/// integer in [0, 1000000]). Does not check pins: the provider refuses unpinned entries with its
/// own message.
std::vector<LockEntry> read_lock_file(const std::string& path);

/// The lock file's text as read from `path` (read_lock_file after reading; the hub fuzz target).
/// Throws LockError like read_lock_file.
std::vector<LockEntry> parse_lock_text(const std::string& text, const std::string& path);

/// The text of `entries` in `format`. libreyolo: JSON with 2-space indent and a final newline;
/// upstream: exactly what Python's `json.dump(locks, f, indent=2)` writes in
/// huggingface/kernels cli lock_kernels (keys repo_id, sha, variants; hash, hash_type; non-ASCII
/// escaped; no final newline). Throws std::runtime_error naming the entry and variant when the
/// upstream format is asked for and a variant has no `hash`.
std::string lock_text(const std::vector<LockEntry>& entries,
                      LockFormat format = LockFormat::libreyolo);

/// Writes lock_text(entries, format) to `path` (through a temporary file and rename). Throws
/// std::runtime_error.
void write_lock_file(const std::string& path, const std::vector<LockEntry>& entries,
                     LockFormat format = LockFormat::libreyolo);

/// Replaces the entry with the same slot and repo_id, or appends.
void upsert(std::vector<LockEntry>& entries, const LockEntry& entry);

/// The lock file the settings mean: `lock_file` when set, else kernels.lock next to
/// `config_file`, else "" (no lock file: nothing is pinned).
std::string lock_file_path(const HubSettings& settings);

/// A malformed LOCAL_KERNELS value; what() is the whole message.
class LocalKernelsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// LOCAL_KERNELS="org/repo=/path/to/kernel:org2/repo2=/path2" (huggingface/kernels load.py
/// _parse_local_kernel_overrides): entries split on ':', each split at its first '='; a later
/// entry for the same repository wins. An empty value means no override. Throws
/// LocalKernelsError: "Invalid LOCAL_KERNELS entry: <entry>. Expected format:
/// repo_id_1=path_1:repo_id_2=path_2" for an entry without '=' (upstream's message), and for a
/// repo_id that is not <org>/<name> or an empty path (this daemon's stricter checks).
std::map<std::string, std::string> parse_local_kernels(const std::string& value);

}  // namespace libreyolo::kernels::hub
