// kernels.lock: the pin of every hub kernel this process may load (repository, 40-hex commit,
// SHA-256 of every file of every locked variant). JSON, a list like huggingface/kernels'
// `kernels lock` output (hf-kernels-hub.md section 2.2) with per-file digests, which that
// format lacks, and the slot the kernel fills:
//
//   [{"repo_id": "kernels-community/deformable-detr", "revision": "v1",
//     "sha": "<40 hex>", "slot": "ms_deform_attn",
//     "variants": {"torch211-cxx11-cu128-x86_64-linux":
//                    {"files": {"metadata.json": "<sha256 hex>", "_x.abi3.so": "<sha256 hex>"}}}}]
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/policy.h"

namespace libreyolo::kernels::hub {

/// Files of one locked variant: path relative to build/<variant>/ -> lower-case hex SHA-256.
struct LockedVariant {
  std::map<std::string, std::string> files;
};

/// One locked kernel repository.
struct LockEntry {
  std::string slot = "ms_deform_attn";  ///< registry slot the kernel implements
  std::string repo_id;                  ///< "org/name"
  std::string revision;                 ///< what was asked for ("v1", "main", a commit)
  std::string sha;                      ///< the commit it resolved to: 40 lower-case hex
  std::map<std::string, LockedVariant> variants;
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

/// Reads `path`. Throws LockError (unreadable file, not JSON, wrong types, unsafe file names).
/// Does not check pins: the provider refuses unpinned entries with its own message.
std::vector<LockEntry> read_lock_file(const std::string& path);

/// The lock file's text as read from `path` (read_lock_file after reading; the hub fuzz target).
/// Throws LockError like read_lock_file.
std::vector<LockEntry> parse_lock_text(const std::string& text, const std::string& path);

/// Writes `entries` to `path` (through a temporary file and rename). Throws std::runtime_error.
void write_lock_file(const std::string& path, const std::vector<LockEntry>& entries);

/// Replaces the entry with the same slot and repo_id, or appends.
void upsert(std::vector<LockEntry>& entries, const LockEntry& entry);

/// The lock file the settings mean: `lock_file` when set, else kernels.lock next to
/// `config_file`, else "" (no lock file: nothing is pinned).
std::string lock_file_path(const HubSettings& settings);

}  // namespace libreyolo::kernels::hub
