// The HTTP port's acceptor and connection loop, on cpp-httplib 0.11 (Debian's libcpp-httplib: the
// compiled library, with its OpenSSL/zlib/brotli defines from pkg-config, which must match the ones
// it was built with).
//
// cpp-httplib parses requests and writes responses; what it lacks for a daemon is replaced
// through its extension points:
//   - threads: its ThreadPool uses std::thread (the stack follows `ulimit -s`) and queues
//     connections without bound; `new_task_queue` gives it a pool of fixed-stack pthreads with
//     a bounded queue (HttpOptions::stack_bytes, max_waiting);
//   - the connection loop: Server::process_and_close_socket is virtual (httplib's SSLServer
//     overrides it the same way). Ours reads through a poll()-based Stream with a deadline on
//     the whole request head (its SocketStream has only a per-read timeout: a client dripping
//     one header byte per second held a thread for hours), caps body bytes (chunked bodies and
//     bodies without Content-Length have no limit in httplib), closes idle keep-alive
//     connections when others wait, and knows the socket, so that a request can tell whether
//     its client went away (api::InferRequest::cancelled);
//   - routing: one pre-routing handler (http_server.cpp) decides every request from its path
//     and method before any body is read.
#include "server/http/acceptor.h"

#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "log/log.h"
#include "server/http/fixed_stack_thread.h"
#include "server/http/kserve_json.h"
#include "server/security/tls.h"

namespace libreyolo::server::http {

thread_local Connection* tl_connection = nullptr;

namespace {

using Clock = std::chrono::steady_clock;

/// Set while the acceptor runs a connection inline because the queue is full: answer 503.
thread_local bool tl_overloaded = false;
/// When the connection a worker is about to serve was accepted: its first request head must be
/// complete within head_seconds of that, however long it waited in the queue.
thread_local std::chrono::steady_clock::time_point tl_accepted_at{};

}  // namespace

/// httplib's TaskQueue: `threads` fixed-stack workers, at most `max_waiting` queued
/// connections; one more is run inline on the acceptor with tl_overloaded set (answered 503 at
/// once: the acceptor never blocks on a busy server).
class WorkerPool final : public httplib::TaskQueue {
 public:
  WorkerPool(int threads, int max_waiting, std::size_t stack_bytes) : max_waiting_(max_waiting) {
    for (int i = 0; i < threads; ++i)
      workers_.push_back(std::make_unique<FixedStackThread>(stack_bytes, [this] { run(); }));
  }
  ~WorkerPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (static_cast<int>(jobs_.size()) < max_waiting_) {
        jobs_.emplace_back(std::move(fn), std::chrono::steady_clock::now());
        waiting_ = static_cast<int>(jobs_.size());
        cv_.notify_one();
        return;
      }
    }
    tl_overloaded = true;
    fn();
    tl_overloaded = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    workers_.clear();  // joins
  }

  /// Connections waiting for a worker.
  int waiting() const { return waiting_.load(); }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      std::chrono::steady_clock::time_point accepted;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and the queue is served
        fn = std::move(jobs_.front().first);
        accepted = jobs_.front().second;
        jobs_.pop_front();
        waiting_ = static_cast<int>(jobs_.size());
      }
      tl_accepted_at = accepted;
      fn();
    }
  }

  const int max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::chrono::steady_clock::time_point>> jobs_;
  std::atomic<int> waiting_{0};
  bool stopping_ = false;
  std::vector<std::unique_ptr<FixedStackThread>> workers_;
};

namespace {

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1 << 30));
}

/// poll() one event, retrying on EINTR; true when it is there within `timeout_ms`.
bool wait_for(int fd, short events, int timeout_ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_until(end));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

/// httplib::Stream over a connected socket, plain or through a TLS session: buffered reads
/// with a deadline for the request head (the bytes up to the first CRLFCRLF after
/// begin_request()) and a per-read timeout for the body, a cap on head and body bytes, writes
/// with a timeout. No select(): no FD_SETSIZE limit.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const HttpOptions& o, security::TlsSession* tls)
      : fd_(fd),
        tls_(tls),
        io_ms_(static_cast<int>(o.io_seconds * 1000)),
        head_ms_(static_cast<int>(o.head_seconds * 1000)),
        // Chunk framing adds a few bytes per chunk to the decoded body the limit is about.
        body_limit_(o.max_body_bytes + 64 * 1024) {}

  /// Starts the head deadline of the next request at `start`.
  void begin_request(Clock::time_point start) {
    in_head_ = true;
    line_start_ = false;  // the request line
    head_bytes_ = 0;
    body_bytes_ = 0;
    crlf_ = 0;
    head_deadline_ = start + std::chrono::milliseconds(head_ms_);
  }
  bool buffered() const { return pos_ < len_; }
  /// Bytes to read without waiting for the socket: ours, or decrypted ones in the TLS session.
  bool has_input() const { return buffered() || (tls_ && tls_->pending()); }

  bool is_readable() const override { return has_input() || wait_for(fd_, POLLIN, io_ms_); }
  bool is_writable() const override { return wait_for(fd_, POLLOUT, io_ms_); }

  ssize_t read(char* ptr, std::size_t size) override {
    if (size == 0) return 0;
    if (in_head_ && head_bytes_ >= kMaxHeadBytes) {
      if (tl_connection) tl_connection->head_too_large = true;
      return -1;
    }
    if (!in_head_ && body_bytes_ >= body_limit_) {
      if (tl_connection) tl_connection->body_too_large = true;
      return -1;
    }
    if (in_head_ && line_start_) {
      line_start_ = false;
      hide_range_header();
    }
    if (!buffered()) {
      const int timeout = in_head_ ? ms_until(head_deadline_) : io_ms_;
      if (timeout <= 0) return -1;
      if (!in_head_ && size >= sizeof(buf_)) {  // large body reads skip the buffer
        const ssize_t n = receive(ptr, std::min(size, body_limit_ - body_bytes_), timeout);
        if (n > 0) body_bytes_ += static_cast<std::size_t>(n);
        return n < 0 ? -1 : n;
      }
      const ssize_t n = receive(buf_, sizeof(buf_), timeout);
      if (n <= 0) return n < 0 ? -1 : 0;
      pos_ = 0;
      len_ = static_cast<std::size_t>(n);
    }
    std::size_t n = std::min(size, len_ - pos_);
    if (in_head_) {
      n = std::min(n, kMaxHeadBytes - head_bytes_);
      // A head read ends at a line's end, so that the next one starts the line (httplib reads
      // the head byte by byte anyway).
      if (const void* nl = std::memchr(buf_ + pos_, '\n', n))
        n = static_cast<std::size_t>(static_cast<const char*>(nl) - (buf_ + pos_)) + 1;
    }
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    account(ptr, n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, std::size_t size) override {
    if (tls_) return tls_->write(ptr, size, io_ms_);
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (!wait_for(fd_, POLLOUT, io_ms_)) return -1;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  /// Read by httplib only for its `socket() >= FD_SETSIZE` guard (500), which protects its own
  /// select()-based stream; this one polls, so any descriptor is fine.
  socket_t socket() const override { return fd_ < FD_SETSIZE ? fd_ : 0; }

 private:
  /// Counts head/body bytes handed out and finds the end of the head (CRLFCRLF; httplib reads
  /// the head one byte at a time, so the switch happens exactly there).
  void account(const char* p, std::size_t n) {
    if (!in_head_) {
      body_bytes_ += n;
      return;
    }
    static const char kEnd[] = "\r\n\r\n";
    for (std::size_t i = 0; i < n; ++i) {
      ++head_bytes_;
      line_start_ = p[i] == '\n';
      if (p[i] == kEnd[crlf_]) {
        if (++crlf_ == 4) {
          in_head_ = false;
          body_bytes_ = n - i - 1;
          return;
        }
      } else {
        crlf_ = p[i] == '\r' ? 1 : 0;
      }
    }
  }

  /// API answers are whole JSON documents and ignore Range. httplib 0.11 parses a Range header
  /// right after the head, before any handler, and answers one it cannot parse (`bytes=5-2`,
  /// `garbage`) 416 (Server::process_request); so a header line that starts with `Range:`
  /// (any case: httplib matches names case-insensitively and takes the bytes before ':' as the
  /// name, read_headers / parse_header) is renamed `Xange:` before httplib reads it. Called at
  /// the start of each header line; reads ahead (within the head deadline) until 6 bytes or the
  /// line's end are buffered, and moves the buffered bytes to the front of buf_ for that.
  void hide_range_header() {
    static const char kName[] = "range:";
    constexpr std::size_t kLen = sizeof(kName) - 1;
    while (len_ - pos_ < kLen && !std::memchr(buf_ + pos_, '\n', len_ - pos_)) {
      std::memmove(buf_, buf_ + pos_, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
      const int timeout = ms_until(head_deadline_);
      if (timeout <= 0) return;
      const ssize_t n = receive(buf_ + len_, sizeof(buf_) - len_, timeout);
      if (n <= 0) return;  // the next read() sees the end or the error again
      len_ += static_cast<std::size_t>(n);
    }
    if (len_ - pos_ >= kLen && ::strncasecmp(buf_ + pos_, kName, kLen) == 0) buf_[pos_] = 'X';
  }

  template <class F>
  void address(F f, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ip.clear();
    port = -1;
    if (f(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char host[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
      port = ntohs(v6->sin6_port);
    }
    ip = host;
  }

  /// Up to `size` bytes within `timeout_ms`: > 0 read, 0 the peer closed, -1 error or timeout.
  ssize_t receive(char* p, std::size_t size, int timeout_ms) {
    if (tls_) return tls_->read(p, size, timeout_ms);
    if (!wait_for(fd_, POLLIN, timeout_ms)) return -1;
    const ssize_t n = ::recv(fd_, p, size, 0);
    return n < 0 ? -1 : n;
  }

  const int fd_;
  security::TlsSession* const tls_;  ///< null: plain text
  const int io_ms_, head_ms_;
  const std::size_t body_limit_;
  char buf_[4096];
  std::size_t pos_ = 0, len_ = 0;
  bool in_head_ = true;
  bool line_start_ = false;  ///< the next head byte starts a header line
  std::size_t head_bytes_ = 0, body_bytes_ = 0;
  int crlf_ = 0;
  Clock::time_point head_deadline_{};
};

}  // namespace

Server::Server(const HttpOptions& options)
    : options_(options),
      pool_(new WorkerPool(options.threads, options.max_waiting, options.stack_bytes)),
      owned_pool_(pool_.load()) {
  new_task_queue = [this] { return owned_pool_.release(); };
}

Server::~Server() = default;

bool Server::process_and_close_socket(socket_t sock) {
  if (tl_overloaded && options_.tls) {
    // A plain-text 503 means nothing to a TLS client, and a handshake on the acceptor thread
    // would stall it: close at once (the client sees the connection reset and retries).
    ::close(sock);
    return true;
  }
  if (tl_overloaded) {
    const std::string body = render_error("busy: every HTTP worker is serving a connection");
    const std::string reply =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    // On the acceptor, so briefly: take the request the client sent (at most 50 ms, 64 KiB),
    // answer, then close without unread bytes (they would turn the close into a reset that
    // can destroy the answer before the client reads it).
    char buf[16384];
    std::size_t taken = 0;
    while (taken < 65536 && wait_for(sock, POLLIN, taken ? 0 : 50)) {
      const ssize_t n = ::recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) break;
      taken += static_cast<std::size_t>(n);
    }
    (void)::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_WR);
    while (wait_for(sock, POLLIN, 20) && ::recv(sock, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    ::close(sock);
    return true;
  }
  std::unique_ptr<security::TlsSession> tls;
  if (options_.tls) {
    if (const std::string error = options_.tls->reload_if_changed(); !error.empty())
      log::warn(
          "HTTP TLS: the renewed certificate files cannot be used, keeping the previous "
          "ones: " +
          error);
    const auto deadline =
        tl_accepted_at + std::chrono::milliseconds(static_cast<int>(options_.head_seconds * 1000));
    std::string why;
    try {
      tls = std::make_unique<security::TlsSession>(options_.tls->current(), sock);
      why = tls->handshake(deadline);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      log::debug("HTTP TLS: handshake failed: " + why);
      tls.reset();
      ::close(sock);
      return false;
    }
  }
  Connection conn;
  conn.fd = sock;
  tl_connection = &conn;
  ConnectionStream strm(sock, options_, tls.get());
  bool ok = true;
  for (int count = kMaxRequestsPerConnection; count > 0 && ok; --count) {
    const bool first = count == kMaxRequestsPerConnection;
    if (!strm.has_input() && !wait_for_request(sock, first)) break;
    // The first request's head counts from the accept (time in the queue included).
    strm.begin_request(first ? tl_accepted_at : Clock::now());
    bool closed = false;
    ok = process_request(strm, count == 1, closed, nullptr);
    if (closed || conn.close_after) break;
  }
  tl_connection = nullptr;
  if (tls) tls->close_notify();
  if (conn.close_after) drain(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

std::string Server::raise_backlog() {
  const socket_t sock = svr_sock_;
  if (sock == INVALID_SOCKET) return "not bound";
  if (::listen(sock, SOMAXCONN) != 0) return std::strerror(errno);
  return "";
}

bool Server::serve_connection(socket_t sock) {
  tl_overloaded = false;
  tl_accepted_at = Clock::now();
  return process_and_close_socket(sock);
}

void Server::drain(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto end = Clock::now() + std::chrono::milliseconds(200);
  char buf[16384];
  for (std::size_t total = 0; total < (1u << 20);) {
    if (!wait_for(fd, POLLIN, ms_until(end))) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    total += static_cast<std::size_t>(n);
  }
}

bool Server::wait_for_request(int fd, bool first_request) {
  const auto end =
      first_request
          ? tl_accepted_at +
                std::chrono::milliseconds(static_cast<int>(options_.head_seconds * 1000))
          : Clock::now() + std::chrono::milliseconds(static_cast<int>(options_.io_seconds * 1000));
  for (bool polled = false; !stopping && Clock::now() < end; polled = true) {
    if (polled && !first_request) {
      const WorkerPool* pool = pool_.load();
      if (pool && pool->waiting() > 0) return false;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, std::min(50, ms_until(end)));
    if (rc > 0) return (p.revents & POLLIN) != 0;
    if (rc < 0 && errno != EINTR) return false;
  }
  return false;
}

std::pair<std::string, int> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? address : address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return {host, -1};
  const int p = std::stoi(port);
  return {host, p > 65535 ? -1 : p};
}

}  // namespace libreyolo::server::http
