// The HTTP port: KServe v2 REST (Open Inference Protocol over HTTP) with Triton's binary tensor
// data, model repository, statistics and system / CUDA shared-memory extensions, forwarding to an
// api::InferenceService like the gRPC transport (server/grpc/grpc_server.h), plus the admin
// endpoints /active and /metrics. Built on cpp-httplib (Debian 12 libcpp-httplib-dev 0.11); no
// torch, no httplib type here.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "server/api/types.h"
#include "server/security/tls.h"

namespace libreyolo::server::shm {
class Registry;
}
namespace libreyolo::server::security {
class AccessPolicy;
}

namespace libreyolo::server::http {

struct HttpOptions {
  std::string address = "0.0.0.0:8000";  ///< host:port ("[v6]:port"); port 0 picks a free one
  /// Largest request body, bytes (server.max_message_bytes, the gRPC receive limit): a larger
  /// Content-Length is answered 413 before the body is read; a chunked body is cut off there.
  std::size_t max_body_bytes = 64u << 20;
  /// Worker threads (server.http_threads): each serves one connection at a time, request after
  /// request (keep-alive). Connections beyond wait in a queue of `max_waiting`; beyond that
  /// they are answered 503 at once.
  int threads = 32;
  int max_waiting = 64;
  /// Stack of every thread of this server, bytes. LibTorch's static thread-local storage lives
  /// at the top of each thread's stack (glibc), and a request runs JSON parsing and the core's
  /// request parsing there: 8 MiB, glibc's default for `ulimit -s 8192`, fixed here so that a
  /// smaller ulimit cannot shrink it (Debian's civetweb used 100 KiB and could not start a
  /// worker once LibTorch was loaded: docs/DESIGN.md "As built").
  std::size_t stack_bytes = 8u << 20;
  /// The request line and headers must arrive within this time (slowloris: a client dripping
  /// header bytes holds a worker at most this long).
  double head_seconds = 2.0;
  /// Longest wait for the next bytes of a body and for a write to make progress, and the idle
  /// time of a keep-alive connection (an idle one closes at once when others wait for a worker).
  double io_seconds = 5.0;
  /// The shared-memory regions (Triton's system and CUDA shared-memory extensions) the server
  /// registers and reads inputs from / writes outputs to: the daemon passes the one it gives the
  /// gRPC transport (GrpcOptions::shm_registry), so a region registered over one is usable over
  /// the other. Null: the server has its own. Must outlive the server.
  shm::Registry* shm_registry = nullptr;
  /// HTTPS when set (server.tls): each connection's handshake must finish within head_seconds
  /// of the accept; the files are re-read when they change (checked at most every
  /// security::kTlsRefreshSeconds, on accept) or on TlsContext::reload() (SIGHUP), and open
  /// connections keep the certificate they started with.
  std::shared_ptr<security::TlsContext> tls;
  /// Who may call what (server.restricted_apis): a denied request is answered 403 before its
  /// body is read. Null: every API open. Must outlive the server.
  const security::AccessPolicy* access = nullptr;
};

/// The endpoints that are not the core's: `GET /active` (JSON) and `GET /metrics` (Prometheus
/// text exposition format 0.0.4).
struct AdminHandlers {
  std::function<std::string()> active_json;
  std::function<std::string()> metrics_text;
};

/// A running HTTP server (see docs/DESIGN.md "As built" and README.md "HTTP/REST" for every
/// route, status code and limit).
class HttpServer {
 public:
  /// Binds and starts. Throws std::runtime_error "HTTP: cannot listen on <address> (...)" when
  /// the address cannot be bound, also when another process listens on it (SO_REUSEPORT off).
  HttpServer(api::InferenceService& service, const HttpOptions& options, AdminHandlers admin);
  /// Stops accepting, lets in-flight requests finish, joins every thread.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The port actually bound.
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server::http
