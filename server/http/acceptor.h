// The HTTP port's acceptor: httplib::Server with our worker threads and connection loop
// (acceptor.cpp says what it replaces in httplib and why), and the per-connection state the
// request handlers of the same thread can see.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "server/http/http_server.h"

namespace libreyolo::server::http {

/// Requests served on one connection before it is closed (httplib's default is 5).
constexpr int kMaxRequestsPerConnection = 1000;

/// Per-connection state the request handlers on the same thread can see.
struct Connection {
  int fd = -1;
  bool close_after = false;  ///< end the connection after this response
  bool body_too_large = false;
  bool head_too_large = false;  ///< the request line and headers passed kMaxHeadBytes
};

/// Bytes of request line + headers accepted (httplib limits each line to 8 KiB, not their
/// count); beyond, the answer is 431.
constexpr std::size_t kMaxHeadBytes = 64 * 1024;
/// The connection this thread serves (null outside a connection loop).
extern thread_local Connection* tl_connection;

class WorkerPool;

/// httplib::Server with our connection loop (see acceptor.cpp).
class Server final : public httplib::Server {
 public:
  /// Starts the workers here, so that a thread that cannot start is a start-up error (thrown
  /// to the daemon) rather than an exception on the listener thread. httplib takes the pool
  /// over when its accept loop starts (new_task_queue) and deletes it after joining it.
  explicit Server(const HttpOptions& options);
  ~Server() override;
  /// Set before stop(): connection loops end instead of waiting for the next request.
  std::atomic<bool> stopping{false};

  /// Serves one connected socket on the calling thread as a worker does (its first request
  /// head due head_seconds from now, never answered 503), then closes it; what the connection
  /// loop returns. For callers without a listener: tests/fuzz/http_request_fuzz.cpp.
  bool serve_connection(socket_t sock);

  /// Raises the listening socket's backlog to SOMAXCONN (the kernel caps it at
  /// net.core.somaxconn); call after bind_to_port. httplib 0.11 listens with a backlog of 5
  /// (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian compiled the library): in a burst, the
  /// handshakes beyond 5 that the acceptor has not taken yet were dropped, and each of those
  /// clients waited about 1 s for its SYN retransmit. Linux's listen() on a listening socket
  /// only updates the backlog (net/ipv4/af_inet.c inet_listen). Returns errno's text, or "".
  std::string raise_backlog();

 private:
  /// One connection, request after request (keep-alive), through ConnectionStream.
  bool process_and_close_socket(socket_t sock) override;
  /// After an answer sent before the request body was read (405, 413, ...): closing a socket
  /// with unread bytes sends a reset, which can destroy the answer before the client reads it.
  /// So: end our side, then read and drop what the client still sends, for at most 200 ms and
  /// 1 MiB (RFC 9112 section 9.6, "lingering close").
  static void drain(int fd);
  /// Waits for the first bytes of a request: the first one of a connection until its head
  /// deadline (head_seconds from the accept), a later one (keep-alive) for io_seconds, or less:
  /// false when the server stops, the peer closed, or, for an idle keep-alive connection, as
  /// soon as other connections wait for a worker (it must not starve health probes).
  bool wait_for_request(int fd, bool first_request);

  const HttpOptions options_;
  std::atomic<WorkerPool*> pool_{nullptr};
  std::unique_ptr<WorkerPool> owned_pool_;  ///< until httplib takes it
};

/// "host:port" -> host (brackets of "[v6]" removed; "" -> 0.0.0.0), port; port -1 when not a
/// number.
std::pair<std::string, int> split_address(const std::string& address);

}  // namespace libreyolo::server::http
