// The HTTP server on cpp-httplib 0.11 (Debian's libcpp-httplib: the compiled library, with its
// OpenSSL/zlib/brotli defines from pkg-config, which must match the ones it was built with).
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
//   - routing: one pre-routing handler decides every request from its path and method (404,
//     405, 411, 413, 415 before any body is read); only the POST endpoints read their body.
#include "server/http/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "log/log.h"
#include "server/http/kserve_json.h"
#include "server/shm/registry.h"
#include "server/shm/tensor_params.h"

namespace libreyolo::server::http {
namespace {

using Clock = std::chrono::steady_clock;

/// Bytes of request line + headers accepted (httplib limits each line to 8 KiB, not their count).
constexpr std::size_t kMaxHeadBytes = 64 * 1024;
/// Requests served on one connection before it is closed (httplib's default is 5).
constexpr int kMaxRequestsPerConnection = 1000;

/// Per-connection state the request handlers on the same thread can see.
struct Connection {
  int fd = -1;
  bool close_after = false;  ///< end the connection after this response
  bool body_too_large = false;
};
thread_local Connection* tl_connection = nullptr;
/// Set while the acceptor runs a connection inline because the queue is full: answer 503.
thread_local bool tl_overloaded = false;
/// When the connection a worker is about to serve was accepted: its first request head must be
/// complete within head_seconds of that, however long it waited in the queue.
thread_local std::chrono::steady_clock::time_point tl_accepted_at{};

/// A thread with a fixed stack size (std::thread cannot set one).
class FixedStackThread {
 public:
  FixedStackThread(std::size_t stack_bytes, std::function<void()> fn) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack_bytes);
    auto* heap = new std::function<void()>(std::move(fn));
    const int rc = pthread_create(
        &thread_, &attr,
        [](void* arg) -> void* {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(arg));
          (*f)();
          return nullptr;
        },
        heap);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      delete heap;
      throw std::runtime_error(std::string("HTTP: cannot start a thread with a ") +
                               std::to_string(stack_bytes) + "-byte stack: " + std::strerror(rc));
    }
  }
  ~FixedStackThread() { join(); }
  FixedStackThread(const FixedStackThread&) = delete;
  FixedStackThread& operator=(const FixedStackThread&) = delete;
  void join() {
    if (joinable_) pthread_join(thread_, nullptr);
    joinable_ = false;
  }

 private:
  pthread_t thread_{};
  bool joinable_ = true;
};

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

/// httplib::Stream over a connected socket: buffered reads with a deadline for the request
/// head (the bytes up to the first CRLFCRLF after begin_request()) and a per-read timeout for
/// the body, a cap on head and body bytes, writes with a timeout. No select(): no FD_SETSIZE
/// limit.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const HttpOptions& o)
      : fd_(fd),
        io_ms_(static_cast<int>(o.io_seconds * 1000)),
        head_ms_(static_cast<int>(o.head_seconds * 1000)),
        // Chunk framing adds a few bytes per chunk to the decoded body the limit is about.
        body_limit_(o.max_body_bytes + 64 * 1024) {}

  /// Starts the head deadline of the next request at `start`.
  void begin_request(Clock::time_point start) {
    in_head_ = true;
    head_bytes_ = 0;
    body_bytes_ = 0;
    crlf_ = 0;
    head_deadline_ = start + std::chrono::milliseconds(head_ms_);
  }
  bool buffered() const { return pos_ < len_; }

  bool is_readable() const override { return buffered() || wait_for(fd_, POLLIN, io_ms_); }
  bool is_writable() const override { return wait_for(fd_, POLLOUT, io_ms_); }

  ssize_t read(char* ptr, std::size_t size) override {
    if (size == 0) return 0;
    if (in_head_ && head_bytes_ >= kMaxHeadBytes) return -1;
    if (!in_head_ && body_bytes_ >= body_limit_) {
      if (tl_connection) tl_connection->body_too_large = true;
      return -1;
    }
    if (!buffered()) {
      const int timeout = in_head_ ? ms_until(head_deadline_) : io_ms_;
      if (timeout <= 0 || !wait_for(fd_, POLLIN, timeout)) return -1;
      if (!in_head_ && size >= sizeof(buf_)) {  // large body reads skip the buffer
        const ssize_t n = ::recv(fd_, ptr, std::min(size, body_limit_ - body_bytes_), 0);
        if (n > 0) body_bytes_ += static_cast<std::size_t>(n);
        return n < 0 ? -1 : n;
      }
      const ssize_t n = ::recv(fd_, buf_, sizeof(buf_), 0);
      if (n <= 0) return n < 0 ? -1 : 0;
      pos_ = 0;
      len_ = static_cast<std::size_t>(n);
    }
    std::size_t n = std::min(size, len_ - pos_);
    if (in_head_) n = std::min(n, kMaxHeadBytes - head_bytes_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    account(ptr, n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, std::size_t size) override {
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

  const int fd_;
  const int io_ms_, head_ms_;
  const std::size_t body_limit_;
  char buf_[4096];
  std::size_t pos_ = 0, len_ = 0;
  bool in_head_ = true;
  std::size_t head_bytes_ = 0, body_bytes_ = 0;
  int crlf_ = 0;
  Clock::time_point head_deadline_{};
};

/// True once the peer closed its side or reset (poll POLLRDHUP/POLLHUP/POLLERR). A client that
/// half-closes after its request counts as gone, as in nginx and Triton's libevhtp.
bool peer_gone(int fd) {
  pollfd p{fd, static_cast<short>(POLLRDHUP), 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

void send_json(httplib::Response& res, int status, std::string body) {
  res.status = status;
  res.body = std::move(body);
  res.set_header("Content-Type", "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  send_json(res, status, render_error(message));
}

/// Notifies the api::CancelToken of every infer request in flight whose client went away
/// (peer_gone) or whose deadline (Triton's `timeout` parameter) passed. The core waits for the
/// token's notification, it does not poll (server/pipeline/infer_pipeline.cpp), and a socket
/// cannot notify: one thread looks at the registered sockets every 20 ms, the way the gRPC
/// side's DeadlineTimer (server/rpc/grpc_server.cpp) serves deadlines.
class PeerWatcher {
 public:
  explicit PeerWatcher(std::size_t stack_bytes)
      : thread_(std::make_unique<FixedStackThread>(stack_bytes, [this] { loop(); })) {}
  ~PeerWatcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.reset();  // joins
  }
  PeerWatcher(const PeerWatcher&) = delete;
  PeerWatcher& operator=(const PeerWatcher&) = delete;

  /// Watches socket `fd` (-1: none) and `deadline` for `token` until remove(id).
  std::uint64_t add(int fd, std::optional<Clock::time_point> deadline,
                    const std::shared_ptr<api::CancelToken>& token) {
    std::lock_guard<std::mutex> lk(mu_);
    const std::uint64_t id = next_id_++;
    entries_[id] = Entry{fd, deadline, token};
    cv_.notify_all();
    return id;
  }
  void remove(std::uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.erase(id);
  }

 private:
  struct Entry {
    int fd = -1;
    std::optional<Clock::time_point> deadline;
    std::shared_ptr<api::CancelToken> token;
  };
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        cv_.wait(lk);
        continue;
      }
      cv_.wait_for(lk, std::chrono::milliseconds(20));
      std::vector<std::pair<std::shared_ptr<api::CancelToken>, api::Code>> due;
      const auto now = Clock::now();
      for (auto it = entries_.begin(); it != entries_.end();) {
        const Entry& e = it->second;
        if (e.deadline && now >= *e.deadline) {
          due.emplace_back(e.token, api::Code::deadline_exceeded);
        } else if (e.fd >= 0 && peer_gone(e.fd)) {
          due.emplace_back(e.token, api::Code::cancelled);
        } else {
          ++it;
          continue;
        }
        it = entries_.erase(it);
      }
      if (due.empty()) continue;
      lk.unlock();  // the callbacks take the core's locks
      for (auto& [token, code] : due) token->cancel(code);
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::unique_ptr<FixedStackThread> thread_;  ///< last: started when the rest exists
};

bool has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

/// The path for error messages: at most 64 bytes shown.
std::string shown_path(const std::string& path) {
  return path.size() <= 64 ? path
                           : path.substr(0, 48) + "... (" + std::to_string(path.size()) + " bytes)";
}

/// The reason phrases of the statuses httplib answers by itself (RFC 9110 section 15).
const char* reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 416:
      return "Range Not Satisfiable";
    case 417:
      return "Expectation Failed";
    case 500:
      return "Internal Server Error";
    default:
      return "HTTP error";
  }
}

/// What a path names.
struct Route {
  enum Kind {
    none,
    server_metadata,
    live,
    ready,
    active,
    metrics,
    all_stats,
    repository_index,
    load,
    unload,
    model_metadata,
    model_ready,
    model_config,
    model_stats,
    infer,
    shm_status,      ///< GET /v2/{system,cuda}sharedmemory[/region/{name}]/status
    shm_register,    ///< POST /v2/{system,cuda}sharedmemory/region/{name}/register
    shm_unregister,  ///< POST /v2/{system,cuda}sharedmemory[/region/{name}]/unregister
  } kind = none;
  std::string model, version;
  std::string region;  ///< shm_*: the region's name ("" = every region of the kind)
  bool cuda = false;   ///< shm_*: cudasharedmemory
  bool post() const {
    return kind == repository_index || kind == load || kind == unload || kind == infer ||
           kind == shm_register || kind == shm_unregister;
  }
};

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  if (path.empty() || path[0] != '/') return out;
  std::size_t at = 1;
  for (;;) {
    const auto slash = path.find('/', at);
    out.push_back(path.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  return out;
}

Route route_of(const std::string& path) {
  Route r;
  if (path == "/active") return r.kind = Route::active, r;
  if (path == "/metrics") return r.kind = Route::metrics, r;
  const auto s = segments(path);
  for (const auto& part : s) {
    if (part.empty()) return r;  // "//", trailing "/"
  }
  if (s.empty() || s[0] != "v2") return r;
  const std::size_t n = s.size();
  if (n == 1) return r.kind = Route::server_metadata, r;
  if (s[1] == "health" && n == 3) {
    if (s[2] == "live") r.kind = Route::live;
    if (s[2] == "ready") r.kind = Route::ready;
    return r;
  }
  if (s[1] == "repository") {
    if (n == 3 && s[2] == "index") r.kind = Route::repository_index;
    if (n == 5 && s[2] == "models" && (s[4] == "load" || s[4] == "unload")) {
      r.kind = s[4] == "load" ? Route::load : Route::unload;
      r.model = s[3];
    }
    return r;
  }
  // Triton's shared-memory extensions (docs/protocol/extension_shared_memory.md, HTTP/REST).
  if (s[1] == "systemsharedmemory" || s[1] == "cudasharedmemory") {
    r.cuda = s[1] == "cudasharedmemory";
    const std::string* action = nullptr;
    if (n == 3) {
      action = &s[2];
    } else if (n == 5 && s[2] == "region") {
      r.region = s[3];
      action = &s[4];
    } else {
      return r;
    }
    if (*action == "status") r.kind = Route::shm_status;
    if (*action == "unregister") r.kind = Route::shm_unregister;
    if (*action == "register" && n == 5) r.kind = Route::shm_register;
    return r;
  }
  if (s[1] != "models" || n < 3) return r;
  if (n == 3 && s[2] == "stats") return r.kind = Route::all_stats, r;
  r.model = s[2];
  std::size_t at = 3;
  if (n >= 5 && s[3] == "versions") {
    r.version = s[4];
    at = 5;
  }
  if (at == n) return r.kind = Route::model_metadata, r;
  if (at + 1 != n) return r;
  const std::string& what = s[at];
  if (what == "ready") r.kind = Route::model_ready;
  if (what == "config") r.kind = Route::model_config;
  if (what == "stats") r.kind = Route::model_stats;
  if (what == "infer") r.kind = Route::infer;
  return r;
}

/// "host:port" -> host (brackets of "[v6]" removed), port; port -1 when not a number.
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

}  // namespace

/// httplib::Server with our connection loop (see the file comment).
class Server final : public httplib::Server {
 public:
  /// Starts the workers here, so that a thread that cannot start is a start-up error (thrown
  /// to the daemon) rather than an exception on the listener thread. httplib takes the pool
  /// over when its accept loop starts (new_task_queue) and deletes it after joining it.
  explicit Server(const HttpOptions& options)
      : options_(options),
        pool_(new WorkerPool(options.threads, options.max_waiting, options.stack_bytes)),
        owned_pool_(pool_.load()) {
    new_task_queue = [this] { return owned_pool_.release(); };
  }
  std::atomic<bool> stopping{false};

 private:
  bool process_and_close_socket(socket_t sock) override {
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
    Connection conn;
    conn.fd = sock;
    tl_connection = &conn;
    ConnectionStream strm(sock, options_);
    bool ok = true;
    for (int count = kMaxRequestsPerConnection; count > 0 && ok; --count) {
      const bool first = count == kMaxRequestsPerConnection;
      if (!strm.buffered() && !wait_for_request(sock, first)) break;
      // The first request's head counts from the accept (time in the queue included).
      strm.begin_request(first ? tl_accepted_at : Clock::now());
      bool closed = false;
      ok = process_request(strm, count == 1, closed, nullptr);
      if (closed || conn.close_after) break;
    }
    tl_connection = nullptr;
    if (conn.close_after) drain(sock);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  /// After an answer sent before the request body was read (405, 413, ...): closing a socket
  /// with unread bytes sends a reset, which can destroy the answer before the client reads it.
  /// So: end our side, then read and drop what the client still sends, for at most 200 ms and
  /// 1 MiB (RFC 9112 section 9.6, "lingering close").
  static void drain(int fd) {
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

  /// Waits for the first bytes of a request: the first one of a connection until its head
  /// deadline (head_seconds from the accept), a later one (keep-alive) for io_seconds, or less:
  /// false when the server stops, the peer closed, or, for an idle keep-alive connection, as
  /// soon as other connections wait for a worker (it must not starve health probes).
  bool wait_for_request(int fd, bool first_request) {
    const auto end =
        first_request
            ? tl_accepted_at +
                  std::chrono::milliseconds(static_cast<int>(options_.head_seconds * 1000))
            : Clock::now() +
                  std::chrono::milliseconds(static_cast<int>(options_.io_seconds * 1000));
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

  const HttpOptions options_;
  std::atomic<WorkerPool*> pool_{nullptr};
  std::unique_ptr<WorkerPool> owned_pool_;  ///< until httplib takes it
};

struct HttpServer::Impl {
  api::InferenceService* core = nullptr;
  std::unique_ptr<shm::Registry> own_registry;  ///< when HttpOptions::shm_registry is null
  shm::Registry* registry = nullptr;
  AdminHandlers admin;
  HttpOptions options;
  std::unique_ptr<PeerWatcher> watcher;  ///< before server: outlives the requests
  std::unique_ptr<Server> server;
  std::unique_ptr<FixedStackThread> listener;
  int port = 0;

  /// Runs `body`, mapping api::Error to its HTTP status and anything else to 500.
  template <class F>
  void guarded(const httplib::Request& req, httplib::Response& res, F&& body) {
    try {
      body();
    } catch (const api::Error& e) {
      send_error(res, http_status(e.code()), e.what());
    } catch (const std::exception& e) {
      log::error("HTTP " + req.method + " " + shown_path(req.path) +
                 ": internal error: " + e.what());
      send_error(res, 500, std::string("internal error: ") + e.what());
    } catch (...) {
      log::error("HTTP " + req.method + " " + shown_path(req.path) + ": internal error");
      send_error(res, 500, "internal error (unknown exception)");
    }
  }

  /// Every request comes here first, before httplib reads any body.
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    const Route r = route_of(req.path);
    const bool get = req.method == "GET" || req.method == "HEAD";
    auto early = [&](int status, const std::string& message) {
      send_error(res, status, message);
      if (has_body(req) && tl_connection) {  // its body is not read: the connection cannot go on
        tl_connection->close_after = true;
        res.set_header("Connection", "close");
      }
      return httplib::Server::HandlerResponse::Handled;
    };
    if (r.kind == Route::none) return early(404, "not found: " + shown_path(req.path));
    if (r.post()) {
      if (req.method != "POST")
        return early(405, req.method + " " + shown_path(req.path) + ": use POST");
      const std::string encoding = req.get_header_value("Content-Encoding");
      if (!encoding.empty() && encoding != "identity")
        return early(415, "Content-Encoding '" + encoding.substr(0, 32) +
                              "' is not supported: send the body uncompressed");
      // httplib would parse a multipart body into parts (and the plain reader cannot take one).
      if (req.is_multipart_form_data())
        return early(415,
                     "multipart/form-data is not supported: send JSON, or JSON and binary "
                     "tensor data (Inference-Header-Content-Length)");
      if (req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
      if (!req.has_header("Content-Length")) {
        if (r.kind == Route::infer)
          return early(411, "POST " + shown_path(req.path) + ": Content-Length is required");
        // No body (curl -X POST): httplib would read one until the connection ends.
        handle_post(r, req, "", res);
        return httplib::Server::HandlerResponse::Handled;
      }
      const std::string length = req.get_header_value("Content-Length");
      if (length.empty() || length.size() > 19 ||
          length.find_first_not_of("0123456789") != std::string::npos)
        return early(400, "Content-Length '" + length.substr(0, 32) + "' is not a byte count");
      if (std::stoull(length) > options.max_body_bytes)
        return early(413, "request body of " + length +
                              " bytes exceeds server.max_message_bytes (" +
                              std::to_string(options.max_body_bytes) + " bytes)");
      return httplib::Server::HandlerResponse::Unhandled;  // httplib reads it, then post()
    }
    if (!get) return early(405, req.method + " " + shown_path(req.path) + ": use GET");
    guarded(req, res, [&] { serve_get(r, res); });
    return httplib::Server::HandlerResponse::Handled;
  }

  void serve_get(const Route& r, httplib::Response& res) {
    switch (r.kind) {
      case Route::live: {
        const bool ok = core->live();
        return send_json(res, ok ? 200 : 503, ok ? "{\"live\":true}" : "{\"live\":false}");
      }
      case Route::ready: {
        const bool ok = core->ready();
        return send_json(res, ok ? 200 : 503, ok ? "{\"ready\":true}" : "{\"ready\":false}");
      }
      case Route::active:
        return send_json(res, 200, admin.active_json());
      case Route::metrics:
        res.status = 200;
        res.body = admin.metrics_text();
        res.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
        return;
      case Route::server_metadata: {
        api::ServerMetadata m = core->server_metadata();
        // The transport serves these (Triton's extension names), as the gRPC side lists them.
        m.extensions.push_back("system_shared_memory");
        if (shm::Registry::cuda_built()) m.extensions.push_back("cuda_shared_memory");
        return send_json(res, 200, render_server_metadata(m));
      }
      case Route::shm_status:
        return send_json(res, 200,
                         r.cuda ? render_cuda_status(registry->cuda_status(r.region))
                                : render_system_status(registry->system_status(r.region)));
      case Route::all_stats:
        return send_json(res, 200, render_statistics(core->model_statistics("", "")));
      case Route::model_metadata:
        return send_json(res, 200, render_model_metadata(core->model_metadata(r.model, r.version)));
      case Route::model_ready: {
        const bool ok = core->model_ready(r.model, r.version);
        return send_json(res, ok ? 200 : 503, ok ? "{\"ready\":true}" : "{\"ready\":false}");
      }
      case Route::model_config:
        return send_json(res, 200, render_model_config(core->model_config(r.model, r.version)));
      case Route::model_stats:
        return send_json(res, 200, render_statistics(core->model_statistics(r.model, r.version)));
      default:
        return send_error(res, 404, "not found");
    }
  }

  /// POST endpoints read their body through httplib's content reader, not into req.body:
  /// httplib's own body reading answers an `application/x-www-form-urlencoded` body (curl -d's
  /// default type) over 8 KiB with 413 and parses it as a form.
  void serve_post(const httplib::Request& req, httplib::Response& res,
                  const httplib::ContentReader& reader) {
    std::string body;
    bool too_large = false;
    const bool read = reader([&](const char* data, std::size_t n) {
      if (body.size() + n > options.max_body_bytes) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (!read) {
      if (tl_connection) {
        tl_connection->close_after = true;
        too_large = too_large || tl_connection->body_too_large;
      }
      res.set_header("Connection", "close");
      if (too_large)
        return send_error(res, 413,
                          "request body exceeds server.max_message_bytes (" +
                              std::to_string(options.max_body_bytes) + " bytes)");
      return send_error(res, 400, "the request body could not be read (incomplete or too slow)");
    }
    handle_post(route_of(req.path), req, body, res);
  }

  void handle_post(const Route& r, const httplib::Request& req, const std::string& body,
                   httplib::Response& res) {
    guarded(req, res, [&] {
      switch (r.kind) {
        case Route::repository_index:
          return send_json(res, 200,
                           render_repository_index(
                               core->repository_index(parse_repository_index_request(body))));
        case Route::load:
          check_repository_request(body, "the load request body");
          core->load_model(r.model);
          return send_json(res, 200, "{}");
        case Route::unload:
          check_repository_request(body, "the unload request body");
          core->unload_model(r.model);
          return send_json(res, 200, "{}");
        case Route::infer:
          return infer(r, req, body, res);
        case Route::shm_register:
          return register_region(r, body, res);
        case Route::shm_unregister:
          check_repository_request(body, "the unregister request body");
          if (r.cuda) {
            registry->unregister_cuda(r.region);
          } else {
            registry->unregister_system(r.region);
          }
          return send_empty(res);
        default:
          return send_error(res, 404, "not found: " + shown_path(req.path));
      }
    });
  }

  /// 200 with an empty body: Triton's answer to a shared-memory register / unregister
  /// (src/http_server.cc HandleSystemSharedMemory, HandleCudaSharedMemory).
  static void send_empty(httplib::Response& res) {
    res.status = 200;
    res.body.clear();
  }

  /// The same Registry calls, errors and log lines as the gRPC side's
  /// (server/rpc/grpc_server.cpp SystemSharedMemoryRegister, CudaSharedMemoryRegister).
  void register_region(const Route& r, const std::string& body, httplib::Response& res) {
    if (r.cuda) {
      const CudaRegisterRequest c = parse_cuda_register(body);
      registry->register_cuda(r.region, c.raw_handle, c.device_id, c.byte_size);
      log::info("CUDA shared memory region '" + r.region + "' registered (device " +
                std::to_string(c.device_id) + ", " + std::to_string(c.byte_size) + " bytes)");
    } else {
      const SystemRegisterRequest q = parse_system_register(body);
      registry->register_system(r.region, q.key, q.offset, q.byte_size);
      log::info("system shared memory region '" + r.region + "' registered (key '" + q.key +
                "', offset " + std::to_string(q.offset) + ", " + std::to_string(q.byte_size) +
                " bytes)");
    }
    send_empty(res);
  }

  void infer(const Route& r, const httplib::Request& req, const std::string& body,
             httplib::Response& res) {
    std::optional<std::string> header;
    if (req.has_header("Inference-Header-Content-Length"))
      header = req.get_header_value("Inference-Header-Content-Length");
    ParsedInfer parsed = parse_infer_request(
        body, header ? std::optional<std::string_view>(*header) : std::nullopt, r.model, r.version);
    auto token = std::make_shared<api::CancelToken>();
    parsed.request.cancel = token;
    // Removed on every way out of this function: the fd is the connection's, which outlives it.
    struct Watch {
      PeerWatcher& watcher;
      std::uint64_t id;
      ~Watch() { watcher.remove(id); }
    } watch{*watcher,
            watcher->add(tl_connection ? tl_connection->fd : -1, parsed.request.deadline, token)};
    // Shared memory (server/shm/tensor_params.h, as the gRPC side): inputs view their region in
    // place (system) or name its device bytes (CUDA); the Views keep every mapping alive until
    // this response is rendered, whatever unregisters it meanwhile.
    std::vector<shm::View> held;
    for (std::size_t i = 0; i < parsed.input_shm.size(); ++i) {
      if (parsed.input_shm[i].used)
        shm::bind_input(parsed.request.inputs[i], parsed.input_shm[i], *registry, held,
                        "the request ('data' or binary_data_size)");
    }
    std::vector<shm::OutputRegion> out_regions;
    for (const auto& [name, p] : parsed.output_shm)
      out_regions.push_back(shm::bind_output(name, p, *registry));
    const api::InferResponse response = core->infer(std::move(parsed.request));
    if (!out_regions.empty()) {
      auto target = [&](const std::string& name) -> const shm::OutputRegion* {
        const shm::OutputRegion* found = nullptr;
        for (const auto& o : out_regions)
          if (o.name == name) found = &o;
        return found;
      };
      for (const auto& t : response.outputs)  // every one fits before any is written
        if (const auto* o = target(t.name)) shm::check_output(t, *o);
      for (const auto& t : response.outputs) {
        if (const auto* o = target(t.name)) {
          shm::write_output(t, *o);
          parsed.format.in_shm[t.name] = shm::output_params(t, *o);
        }
      }
    }
    RenderedBody out = render_infer_response(response, parsed.format);
    res.status = 200;
    res.body = std::move(out.body);
    if (out.header_length) {
      res.set_header("Inference-Header-Content-Length", std::to_string(*out.header_length));
      res.set_header("Content-Type", "application/octet-stream");
    } else {
      res.set_header("Content-Type", "application/json");
    }
  }

  /// Responses httplib makes itself (400 malformed request, 414, a body that could not be
  /// read) get the JSON error body too; the connection ends after them.
  httplib::Server::HandlerResponse on_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (tl_connection) {
      tl_connection->close_after = true;
      res.set_header("Connection", "close");
      if (tl_connection->body_too_large) {
        res.status = 413;
        send_error(res, 413,
                   "request body exceeds server.max_message_bytes (" +
                       std::to_string(options.max_body_bytes) + " bytes)");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    (void)req;
    send_error(res, res.status, reason_phrase(res.status));
    return httplib::Server::HandlerResponse::Handled;
  }
};

HttpServer::HttpServer(api::InferenceService& service, const HttpOptions& options,
                       AdminHandlers admin)
    : impl_(std::make_unique<Impl>()) {
  impl_->core = &service;
  impl_->registry = options.shm_registry;
  if (!impl_->registry) {
    impl_->own_registry = std::make_unique<shm::Registry>();
    impl_->registry = impl_->own_registry.get();
  }
  impl_->admin = std::move(admin);
  impl_->options = options;
  impl_->watcher = std::make_unique<PeerWatcher>(options.stack_bytes);
  impl_->server = std::make_unique<Server>(options);
  auto& s = *impl_->server;
  Impl* impl = impl_.get();
  // httplib's default sets SO_REUSEPORT: a second daemon could bind the same port and take
  // half of the connections (the gRPC side had that bug, issue 17). SO_REUSEADDR only.
  s.set_socket_options([](socket_t sock) {
    const int one = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  s.set_payload_max_length(options.max_body_bytes);
  // What the Keep-Alive response header announces; the connection loop enforces both.
  s.set_keep_alive_max_count(kMaxRequestsPerConnection);
  s.set_keep_alive_timeout(static_cast<time_t>(options.io_seconds));
  s.set_read_timeout(static_cast<time_t>(options.io_seconds));
  s.set_write_timeout(static_cast<time_t>(options.io_seconds));
  s.set_pre_routing_handler([impl](const httplib::Request& req, httplib::Response& res) {
    return impl->pre_route(req, res);
  });
  s.Post(".*",
         [impl](const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader) { impl->serve_post(req, res, reader); });
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [impl](const httplib::Request& req, httplib::Response& res) {
        return impl->on_error(req, res);
      }));
  s.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log::error("HTTP " + req.method + " " + shown_path(req.path) + ": internal error: " + what);
        send_error(res, 500, "internal error: " + what);
      });

  const auto [host, port] = split_address(options.address);
  const char* why = "the port is in use, e.g. by another daemon, or the address is not local";
  if (port < 0) {
    why = "the port must be a number from 0 to 65535";
  } else if (port == 0) {
    impl_->port = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, port)) {
    impl_->port = port;
  }
  if (impl_->port <= 0)
    throw std::runtime_error("HTTP: cannot listen on " + options.address + " (" + why + ")");
  impl_->listener = std::make_unique<FixedStackThread>(options.stack_bytes, [impl] {
    try {
      impl->server->listen_after_bind();
    } catch (const std::exception& e) {
      log::error(std::string("HTTP: the accept loop ended: ") + e.what());
    }
  });
  // stop() does nothing until the accept loop runs: wait for it, so that the destructor can
  // always end it.
  for (int i = 0; i < 5000 && !s.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  log::info("HTTP listening on " + options.address + " (port " + std::to_string(impl_->port) +
            "; KServe v2 REST, /metrics, /active; " + std::to_string(options.threads) +
            " worker threads)");
}

HttpServer::~HttpServer() {
  impl_->server->stopping = true;
  impl_->server->stop();  // closes the listening socket; listen_after_bind joins the workers
  impl_->listener.reset();
}

int HttpServer::port() const { return impl_->port; }

}  // namespace libreyolo::server::http
