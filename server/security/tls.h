// TLS for the daemon's ports (server.tls): the certificate files, their check at start-up, the
// HTTP port's OpenSSL context (reloaded when the files change or on SIGHUP) and one TLS
// connection over a non-blocking socket. The gRPC port takes the same files through gRPC's own
// credentials (server/grpc/grpc_server.cpp). No OpenSSL type in this header.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace libreyolo::server::security {

/// The certificate files of server.tls, as absolute paths. TLS is on when cert_file is set.
struct TlsFiles {
  std::string cert_file;       ///< PEM: the server certificate, then its chain
  std::string key_file;        ///< PEM: its private key (unencrypted)
  std::string client_ca_file;  ///< PEM: set for mutual TLS (clients must present a
                               ///< certificate this CA signed); "" accepts any client
  bool enabled() const { return !cert_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

/// Seconds between two checks of the files for a renewal (both ports; gRPC's
/// FileWatcherCertificateProvider takes it as its refresh interval).
inline constexpr unsigned kTlsRefreshSeconds = 10;

/// Reads a whole file. Throws std::runtime_error "TLS: cannot read <role> <path> (<errno text>)".
std::string read_file(const std::string& path, const char* role);

/// The HTTP port's server context. Connections take the current one; a reload replaces it for
/// the connections accepted afterwards and leaves the open ones as they are.
class TlsContext {
 public:
  /// Loads and checks the files: TLS 1.2 or newer, the key matching the certificate, the client
  /// CA readable. Throws std::runtime_error naming the file and OpenSSL's reason.
  explicit TlsContext(TlsFiles files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  const TlsFiles& files() const { return files_; }

  /// The context new connections use (shared: a reload does not free it under them).
  std::shared_ptr<ssl_ctx_st> current() const;

  /// Reads the files again. "" on success; else the error, and the previous context stays.
  std::string reload();

  /// reload() when a file's modification time or size changed since the last load and at
  /// least kTlsRefreshSeconds passed since the last check; "" when nothing was done.
  std::string reload_if_changed();

 private:
  std::string stamp() const;  // the files' mtimes and sizes

  const TlsFiles files_;
  mutable std::mutex mu_;
  std::shared_ptr<ssl_ctx_st> ctx_;
  std::string stamp_;
  std::chrono::steady_clock::time_point checked_{};
};

/// One server-side TLS connection over a connected socket, which it makes non-blocking. Every
/// wait has a deadline: a client that stalls a handshake or a record holds its worker no longer
/// than the caller allows.
class TlsSession {
 public:
  /// Throws std::runtime_error when OpenSSL cannot make the connection object.
  TlsSession(const std::shared_ptr<ssl_ctx_st>& ctx, int fd);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  /// The server's side of the handshake, until `deadline`. "" on success, else why it failed
  /// (OpenSSL's reason, e.g. "certificate verify failed" for a client certificate the CA did
  /// not sign, or "timed out").
  std::string handshake(std::chrono::steady_clock::time_point deadline);

  /// Up to `size` bytes of application data: > 0 bytes read, 0 the peer closed, -1 an error
  /// or no data within `timeout_ms`.
  ssize_t read(char* data, std::size_t size, int timeout_ms);

  /// All of `size` bytes, each wait for the socket at most `timeout_ms`: `size`, or -1.
  ssize_t write(const char* data, std::size_t size, int timeout_ms);

  /// Decrypted bytes already buffered (a poll() on the socket would not see them).
  bool pending() const;

  /// Sends close_notify (best effort, no wait).
  void close_notify();

 private:
  /// Waits as OpenSSL asks after a call returned `ret`: true to retry, false on an error or
  /// when `timeout_ms` passed.
  bool wait(int ret, int timeout_ms);

  ssl_st* ssl_ = nullptr;
  int fd_;
};

}  // namespace libreyolo::server::security
