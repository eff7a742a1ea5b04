#include "kernels/hub/digest.h"

#include "kernels/hub/lock.h"

#include <openssl/evp.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

namespace libreyolo::kernels::hub {
namespace {

using Ctx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

// git_blob: "blob <size>\0" is hashed before the content (a git blob id, with SHA-1).
std::vector<unsigned char> digest_file(const std::string& path, const EVP_MD* md,
                                       bool git_blob = false) {
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot read " + path);
  Ctx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) {
    throw std::runtime_error("OpenSSL digest initialisation failed");
  }
  if (git_blob) {
    struct stat st {};
    if (::fstat(fileno(f.get()), &st) != 0) throw std::runtime_error("cannot stat " + path);
    const std::string header = "blob " + std::to_string(st.st_size) + std::string(1, '\0');
    EVP_DigestUpdate(ctx.get(), header.data(), header.size());
  }
  std::vector<char> buf(1 << 20);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  }
  if (std::ferror(f.get())) throw std::runtime_error("error reading " + path);
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), out.data(), &len);
  out.resize(len);
  return out;
}

std::string hex(const std::vector<unsigned char>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : d) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), out.data(), &len, EVP_sha256(), nullptr);
  out.resize(len);
  return hex(out);
}

std::string sha256_hex_file(const std::string& path) {
  return hex(digest_file(path, EVP_sha256()));
}

std::string digest_base64_file(const std::string& path, const std::string& algorithm) {
  const EVP_MD* md = algorithm == "sha256"   ? EVP_sha256()
                     : algorithm == "sha512" ? EVP_sha512()
                                             : nullptr;
  if (!md) throw std::runtime_error("unknown digest algorithm '" + algorithm + "'");
  const auto d = digest_file(path, md);
  std::string out(4 * ((d.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), d.data(),
                                static_cast<int>(d.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string git_blob_sha1_hex_file(const std::string& path) {
  return hex(digest_file(path, EVP_sha1(), true));
}

std::string git_blob_sha1_hex(std::string_view bytes) {
  std::string data = "blob " + std::to_string(bytes.size()) + std::string(1, '\0');
  data.append(bytes.data(), bytes.size());
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha1(), nullptr);
  out.resize(len);
  return hex(out);
}

std::string git_lfs_concat_hash(std::vector<std::pair<std::string, std::string>> files) {
  files.erase(std::remove_if(files.begin(), files.end(),
                             [](const auto& f) { return excluded_from_variant_hash(f.first); }),
              files.end());
  // Python sorts (bytes, str) tuples: path bytes unsigned lexicographic, then the hash;
  // std::string compares char_traits<char>, which is unsigned-byte order (memcmp).
  std::sort(files.begin(), files.end());
  Ctx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL digest initialisation failed");
  }
  for (const auto& [path, hash] : files) {
    if (hash.size() % 2 != 0) {
      throw std::invalid_argument("hash of " + path + " is not hex: '" + hash + "'");
    }
    std::string bytes;
    for (size_t i = 0; i < hash.size(); i += 2) {
      const int hi = hex_value(hash[i]), lo = hex_value(hash[i + 1]);
      if (hi < 0 || lo < 0) {
        throw std::invalid_argument("hash of " + path + " is not hex: '" + hash + "'");
      }
      bytes += static_cast<char>(hi * 16 + lo);
    }
    EVP_DigestUpdate(ctx.get(), path.data(), path.size());
    EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  }
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), out.data(), &len);
  out.resize(len);
  return "sha256-" + hex(out);
}

}  // namespace libreyolo::kernels::hub
