// File digests for the hub provider: SHA-256 (kernels.lock) and the base64 SHA-256/512 of
// metadata.json's `digest` (kernels-data/src/digest.rs, hf-kernels-hub.md section 2.2). OpenSSL.
#pragma once

#include <string>
#include <string_view>

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

}  // namespace libreyolo::kernels::hub
