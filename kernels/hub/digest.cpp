#include "kernels/hub/digest.h"

#include <openssl/evp.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

namespace libreyolo::kernels::hub {
namespace {

using Ctx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

std::vector<unsigned char> digest_file(const std::string& path, const EVP_MD* md) {
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot read " + path);
  Ctx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) {
    throw std::runtime_error("OpenSSL digest initialisation failed");
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

}  // namespace libreyolo::kernels::hub
