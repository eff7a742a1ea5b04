// File digests for the hub provider: SHA-256 (kernels.lock) and the base64 SHA-256/512 of
// metadata.json's `digest` (kernels-data/src/digest.rs, hf-kernels-hub.md section 2.2). OpenSSL.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace libreyolo::kernels::hub {

/// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);

/// Lower-case hex SHA-256 of the file's content. Throws std::runtime_error naming the path when
/// it cannot be read.
std::string sha256_hex_file(const std::string& path);

/// Standard base64 (with padding) of the file's `algorithm` digest, `algorithm` "sha256" or
/// "sha512" (metadata.json `digest.algorithm`). Throws std::runtime_error on an unknown
/// algorithm or an unreadable file.
std::string digest_base64_file(const std::string& path, const std::string& algorithm);

/// Lower-case hex git blob id of the file: SHA-1 of "blob <size>\0" followed by the content
/// (what the Hub's tree API lists as a file's `oid`). Throws std::runtime_error like
/// sha256_hex_file.
std::string git_blob_sha1_hex_file(const std::string& path);

/// Lower-case hex git blob id of `bytes` (see git_blob_sha1_hex_file).
std::string git_blob_sha1_hex(std::string_view bytes);

/// huggingface/kernels' `git_lfs_concat` hash of one build variant (kernels/src/kernels/locking.py,
/// get_kernel_locks): `files` are (path relative to build/<variant>/, the file's hash as lower-case
/// hex: the LFS SHA-256 for LFS files, else the 40-hex git blob id). Files that
/// excluded_from_variant_hash() (kernels/hub/lock.h) names are skipped; the rest are sorted
/// bytewise by path (then hash), and SHA-256 runs over path bytes followed by the hash's bytes (hex
/// decoded) for each. Returns "sha256-<64 hex>". Throws std::invalid_argument when a hash is not
/// hex of even length.
std::string git_lfs_concat_hash(std::vector<std::pair<std::string, std::string>> files);

}  // namespace libreyolo::kernels::hub
