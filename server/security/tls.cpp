// OpenSSL 3 (Debian 12's libssl) behind security/tls.h.
#include "server/security/tls.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace libreyolo::server::security {
namespace {

using Clock = std::chrono::steady_clock;

/// The oldest error of this thread's OpenSSL queue as text (the queue is emptied).
std::string openssl_error(const char* fallback = "unknown OpenSSL error") {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  const char* reason = ERR_reason_error_string(e);
  return reason ? reason : fallback;
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("TLS: " + what); }

/// Makes a context from the files; throws naming the file that failed.
SSL_CTX* make_context(const TlsFiles& f) {
  // Fail with errno's text rather than OpenSSL's "system lib" for a file that cannot be read.
  (void)read_file(f.cert_file, "certificate file");
  (void)read_file(f.key_file, "key file");
  if (f.mutual()) (void)read_file(f.client_ca_file, "client CA file");
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_server_method()),
                                                        &SSL_CTX_free);
  if (!ctx) fail("cannot make a context (" + openssl_error() + ")");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Client-initiated renegotiation costs the server a handshake per request of the client's.
  long options = SSL_OP_NO_RENEGOTIATION;
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
  // A peer that closes without close_notify (curl on error, a killed client) is an end of
  // stream, as on a plain socket, not an error.
  options |= SSL_OP_IGNORE_UNEXPECTED_EOF;
#endif
  SSL_CTX_set_options(ctx.get(), options);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), f.cert_file.c_str()) != 1)
    fail("certificate file " + f.cert_file + " is not a usable PEM certificate (" +
         openssl_error() + ")");
  // OpenSSL compares the key with the certificate already while loading it (reason "key
  // values mismatch"); the check after covers a key it could load but not compare.
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), f.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH ||
                          ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH ||
                          ERR_peek_error() == 0;
    const std::string why = openssl_error("the key does not match");
    if (mismatch)
      fail("key file " + f.key_file + " does not match certificate file " + f.cert_file + " (" +
           why + ")");
    fail("key file " + f.key_file + " is not a usable PEM private key (" + why + ")");
  }
  if (f.mutual()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), f.client_ca_file.c_str(), nullptr) != 1)
      fail("client CA file " + f.client_ca_file + " holds no usable PEM certificate (" +
           openssl_error() + ")");
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(f.client_ca_file.c_str());
    if (!names) fail("client CA file " + f.client_ca_file + ": " + openssl_error());
    SSL_CTX_set_client_CA_list(ctx.get(), names);  // takes ownership
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx.release();
}

std::shared_ptr<ssl_ctx_st> share(SSL_CTX* ctx) { return {ctx, &SSL_CTX_free}; }

/// Blocks SIGPIPE in this thread while it lives and swallows one raised meanwhile: OpenSSL
/// writes with write(2), which raises SIGPIPE on a connection the peer reset (a plain socket
/// sends with MSG_NOSIGNAL instead). The per-thread way, as libpq does, leaves the process's
/// disposition alone.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~NoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      (void)sigtimedwait(&pipe, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t old_{};
  bool was_pending_ = false;
};

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, INT_MAX));
}

}  // namespace

std::string read_file(const std::string& path, const char* role) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(std::string("cannot read ") + role + " " + path + " (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TlsContext::TlsContext(TlsFiles files) : files_(std::move(files)) {
  ctx_ = share(make_context(files_));
  stamp_ = stamp();
  checked_ = Clock::now();
}

TlsContext::~TlsContext() = default;

std::shared_ptr<ssl_ctx_st> TlsContext::current() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ctx_;
}

std::string TlsContext::stamp() const {
  std::string out;
  for (const auto* p : {&files_.cert_file, &files_.key_file, &files_.client_ca_file}) {
    struct stat st {};
    if (p->empty() || ::stat(p->c_str(), &st) != 0) {
      out += "-;";
      continue;
    }
    out += std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + ":" +
           std::to_string(st.st_size) + ":" + std::to_string(st.st_ino) + ";";
  }
  return out;
}

std::string TlsContext::reload() {
  const std::string now = stamp();
  try {
    auto fresh = share(make_context(files_));
    std::lock_guard<std::mutex> lk(mu_);
    ctx_ = std::move(fresh);
    stamp_ = now;
    checked_ = Clock::now();
    return {};
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(mu_);
    stamp_ = now;  // the same broken files are not retried at every check
    checked_ = Clock::now();
    return e.what();
  }
}

std::string TlsContext::reload_if_changed() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (Clock::now() - checked_ < std::chrono::seconds(kTlsRefreshSeconds)) return {};
    checked_ = Clock::now();
  }
  const std::string now = stamp();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (now == stamp_) return {};
  }
  return reload();
}

TlsSession::TlsSession(const std::shared_ptr<ssl_ctx_st>& ctx, int fd) : fd_(fd) {
  ssl_ = SSL_new(ctx.get());  // holds its own reference to the context
  if (!ssl_ || SSL_set_fd(ssl_, fd) != 1) {
    if (ssl_) SSL_free(ssl_);
    ssl_ = nullptr;
    fail("cannot make a connection (" + openssl_error() + ")");
  }
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

TlsSession::~TlsSession() {
  if (ssl_) SSL_free(ssl_);
}

bool TlsSession::wait(int ret, int timeout_ms) {
  const int e = SSL_get_error(ssl_, ret);
  short events = 0;
  if (e == SSL_ERROR_WANT_READ) {
    events = POLLIN;
  } else if (e == SSL_ERROR_WANT_WRITE) {
    events = POLLOUT;
  } else if (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EINTR)) {
    events = POLLIN;
  } else {
    return false;
  }
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, ms_until(end));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

std::string TlsSession::handshake(Clock::time_point deadline) {
  NoSigpipe guard;
  for (;;) {
    ERR_clear_error();
    const int ret = SSL_accept(ssl_);
    if (ret == 1) return {};
    const int e = SSL_get_error(ssl_, ret);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
        return ret == 0 || errno == 0 ? "the client closed the connection"
                                      : std::string(std::strerror(errno));
      return openssl_error("handshake failed");
    }
    if (ms_until(deadline) <= 0 || !wait(ret, ms_until(deadline))) return "timed out";
  }
}

ssize_t TlsSession::read(char* data, std::size_t size, int timeout_ms) {
  if (size == 0) return 0;
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  NoSigpipe guard;  // a read may write (a key update's answer, an alert)
  for (;;) {
    ERR_clear_error();
    const int n = SSL_read(ssl_, data, static_cast<int>(std::min<std::size_t>(size, INT_MAX)));
    if (n > 0) return n;
    const int e = SSL_get_error(ssl_, n);
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    if (e == SSL_ERROR_SYSCALL && n == 0 && ERR_peek_error() == 0) return 0;
    if (ms_until(end) <= 0 || !wait(n, ms_until(end))) return -1;
  }
}

ssize_t TlsSession::write(const char* data, std::size_t size, int timeout_ms) {
  NoSigpipe guard;
  std::size_t done = 0;
  while (done < size) {
    ERR_clear_error();
    const int chunk = static_cast<int>(std::min<std::size_t>(size - done, 1 << 20));
    const int n = SSL_write(ssl_, data + done, chunk);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (!wait(n, timeout_ms)) return -1;
  }
  return static_cast<ssize_t>(size);
}

bool TlsSession::pending() const { return SSL_pending(ssl_) > 0; }

void TlsSession::close_notify() {
  NoSigpipe guard;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace libreyolo::server::security
