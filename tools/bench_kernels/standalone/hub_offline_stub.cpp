// Offline stand-ins for kernels/hub/http.cpp and digest.cpp, used only by the kernels-only GPU
// build when libcurl or OpenSSL is missing there: every download or digest throws, so the hub
// provider disables itself (one warning, one fallback event) and nothing else changes.
#include <cctype>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/hub/digest.h"
#include "kernels/hub/http.h"

namespace libreyolo::kernels::hub {
namespace {
[[noreturn]] void offline(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": built without libcurl/OpenSSL (kernels-only build)");
}
}  // namespace

std::string http_get(const std::string&, const HttpOptions&) { offline("http_get"); }
void http_download(const std::string&, const std::string&, const HttpOptions&) {
  offline("http_download");
}
std::string url_escape_segment(const std::string& segment) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : segment) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}
std::string sha256_hex(std::string_view) { offline("sha256_hex"); }
std::string sha256_hex_file(const std::string&) { offline("sha256_hex_file"); }
std::string digest_base64_file(const std::string&, const std::string&) {
  offline("digest_base64_file");
}
std::string git_blob_sha1_hex_file(const std::string&) { offline("git_blob_sha1_hex_file"); }
std::string git_blob_sha1_hex(std::string_view) { offline("git_blob_sha1_hex"); }
std::string git_lfs_concat_hash(std::vector<std::pair<std::string, std::string>>) {
  offline("git_lfs_concat_hash");
}

}  // namespace libreyolo::kernels::hub
