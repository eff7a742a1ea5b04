// Model names of the repository as RepositoryModelLoad/Unload receive them (Triton's
// model_control explicit): a name is one plain folder name inside model_repository, never a path.
// No torch in this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace libreyolo::server {

/// Longest accepted model name, bytes (NAME_MAX of Linux file systems).
constexpr std::size_t kMaxModelNameBytes = 255;

/// `name` printable in a log line or status message: control characters, '\\' and bytes >= 0x7f
/// as \xNN; after `max_bytes` output bytes, "..." ends it.
std::string printable_name(const std::string& name, std::size_t max_bytes = 80);

/// `name` for an error message, quoted: '<printable_name(name)>' when at most 64 bytes, else its
/// first 48 bytes as '<...>...' (N bytes)' (as models::core::clip_json_error clips long tokens):
/// a 15,000-byte name echoed whole made the status message exceed gRPC's 8 KiB metadata limit
/// and the client got RESOURCE_EXHAUSTED instead of the real status.
std::string quoted_name(const std::string& name);

/// Throws api::Error INVALID_ARGUMENT "model_name '<name>': <problem>" when `name` is not a plain
/// folder name: empty, longer than kMaxModelNameBytes, "." or "..", containing '/' or '\\'
/// (absolute and relative paths), or a control character (bytes < 0x20 and 0x7f).
void check_model_name(const std::string& name);

/// The folder <repository>/<name> after check_model_name(name). Throws api::Error
/// INVALID_ARGUMENT naming model_name when the folder is a symbolic link (or sits behind one)
/// whose target resolves outside the repository (realpath(3) of both compared), and NOT_FOUND
/// when no such folder exists.
std::string model_folder(const std::string& repository, const std::string& name);

/// Highest numeric version folder <folder>/<N>/ (N without leading zeros, at most 17 digits);
/// -1 when there is none.
std::int64_t highest_version(const std::string& folder);

}  // namespace libreyolo::server
