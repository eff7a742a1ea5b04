// libFuzzer entry: arbitrary bytes as what a client sends to the HTTP port's TLS front
// (server/security/tls.cpp: TlsContext's server context, TlsSession's non-blocking handshake
// with its deadline) over a socketpair. The certificate is a self-signed P-256 one made at start
// with OpenSSL and written to a temporary folder, so that TlsContext loads it as the daemon
// loads server.tls's files.
// Input: 1 byte (bit 0: mutual TLS, the client CA being the same certificate), then the client's
// bytes (TLS records: a ClientHello, for TLS 1.2 also a Certificate), followed by the end of the
// stream. Checks beyond "no crash": the handshake fails (no client answers the server's key
// share), with a one-line reason, and never by timing out (every byte is there, then the end).
// OpenSSL itself is Debian's library, not instrumented: libFuzzer's coverage is tls.cpp's.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "server/security/tls.h"

using namespace libreyolo::server::security;
using libreyolo::fuzz::fail;

namespace {

std::string g_dir;

void remove_files() {
  for (const char* f : {"/cert.pem", "/key.pem"}) std::remove((g_dir + f).c_str());
  ::rmdir(g_dir.c_str());
}

/// A self-signed certificate for "localhost" with a P-256 key, as PEM files in a temporary
/// folder (removed at exit); the two contexts: plain and mutual TLS.
struct Contexts {
  std::unique_ptr<TlsContext> plain, mutual;
  Contexts() {
    char dir[] = "/tmp/tls_front_fuzz.XXXXXX";
    if (!::mkdtemp(dir)) fail("mkdtemp");
    g_dir = dir;
    std::atexit(remove_files);
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    if (!key || !cert) fail("cannot make a key or a certificate");
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600L * 24 * 365);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    if (X509_sign(cert, key, EVP_sha256()) == 0) fail("cannot sign the certificate");
    FILE* c = std::fopen((g_dir + "/cert.pem").c_str(), "w");
    FILE* k = std::fopen((g_dir + "/key.pem").c_str(), "w");
    if (!c || !k || PEM_write_X509(c, cert) != 1 ||
        PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
      fail("cannot write the PEM files");
    std::fclose(c);
    std::fclose(k);
    X509_free(cert);
    EVP_PKEY_free(key);
    TlsFiles files{g_dir + "/cert.pem", g_dir + "/key.pem", ""};
    plain = std::make_unique<TlsContext>(files);
    files.client_ca_file = files.cert_file;
    mutual = std::make_unique<TlsContext>(files);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Contexts contexts;
  if (size < 1) return 0;
  const TlsContext& ctx = (data[0] & 1) ? *contexts.mutual : *contexts.plain;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) fail("socketpair");
  // The client's bytes fit the socket's buffer (inputs are at most a few KiB: fuzz-max-len.sh).
  std::size_t sent = 0;
  while (sent < size - 1) {
    const ssize_t n = ::send(fds[1], data + 1 + sent, size - 1 - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fds[1], SHUT_WR);
  std::string why;
  {
    TlsSession session(ctx.current(), fds[0]);
    why = session.handshake(std::chrono::steady_clock::now() + std::chrono::seconds(20));
    session.close_notify();
  }
  ::close(fds[0]);
  ::close(fds[1]);
  if (why.empty()) fail("the handshake completed with a client that answers nothing");
  if (why == "timed out") fail("the handshake timed out although the client's stream had ended");
  if (why.find('\n') != std::string::npos) fail("the reason has several lines: " + why);
  return 0;
}
