// A minimal HTTP/1.1 server for the four admin GET endpoints: one accept thread, one short-lived
// thread per connection, one request per connection (Connection: close).
//
// Why not civetweb (DESIGN.md's choice): Debian's libcivetweb is built with a fixed 100 KiB worker
// stack (USE_STACK_SIZE) and LibTorch's static thread-local storage does not fit in it, so every
// civetweb worker fails with "Cannot create first worker thread" once LibTorch is in the process.
#include "server/core/http_admin.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "log/log.h"

namespace libreyolo::server {
namespace {

void send_all(int fd, const std::string& data) {
  std::size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
  }
}

void reply(int fd, int status, const char* type, const std::string& body, bool head = false) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 404 ? "Not Found"
                       : status == 405 ? "Method Not Allowed"
                       : status == 503 ? "Service Unavailable"
                                       : "Internal Server Error";
  std::string out =
      "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  send_all(fd, out);
}

/// Splits "host:port" (host may be empty, "0.0.0.0", "[::1]", a name).
std::pair<std::string, std::string> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return {"", address};
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, address.substr(colon + 1)};
}

}  // namespace

/// Seconds a client has to send its whole request head (kubelet, Prometheus and curl send it
/// in one write); also bounds how long the destructor waits for connection threads.
constexpr int kHeadSeconds = 2;

struct HttpAdmin::Impl {
  HttpHandlers handlers;
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<int> active{0};
  std::thread acceptor;

  void serve(int fd) {
    // Read the request head (up to 8 KiB) within kHeadSeconds in total, not per read: a client
    // dripping one byte at a time (slowloris) would otherwise hold one of the 64 connection
    // slots for hours, and 64 of them would answer every health probe and scrape "busy".
    std::string head;
    char buf[2048];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHeadSeconds);
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      head.append(buf, static_cast<std::size_t>(n));
    }
    const auto sp1 = head.find(' ');
    const auto sp2 = sp1 == std::string::npos ? sp1 : head.find(' ', sp1 + 1);
    if (sp2 == std::string::npos) {
      reply(fd, 400, "text/plain", "bad request\n");
      return;
    }
    const std::string method = head.substr(0, sp1);
    std::string uri = head.substr(sp1 + 1, sp2 - sp1 - 1);
    uri = uri.substr(0, uri.find('?'));
    const bool is_head = method == "HEAD";
    if (method != "GET" && !is_head) {
      reply(fd, 405, "text/plain", "only GET\n");
      return;
    }
    try {
      if (uri == "/v2/health/live") {
        const bool ok = handlers.live();
        reply(fd, ok ? 200 : 503, "application/json", ok ? "{\"live\":true}" : "{\"live\":false}",
              is_head);
      } else if (uri == "/v2/health/ready") {
        const bool ok = handlers.ready();
        reply(fd, ok ? 200 : 503, "application/json", ok ? "{\"ready\":true}" : "{\"ready\":false}",
              is_head);
      } else if (uri == "/active") {
        reply(fd, 200, "application/json", handlers.active_json(), is_head);
      } else if (uri == "/metrics") {
        reply(fd, 200, "text/plain; version=0.0.4; charset=utf-8", handlers.metrics_text(),
              is_head);
      } else {
        reply(fd, 404, "text/plain", "not found: " + uri + "\n", is_head);
      }
    } catch (const std::exception& e) {
      log::error("HTTP " + uri + ": " + e.what());
      reply(fd, 500, "text/plain", std::string("internal error: ") + e.what() + "\n", is_head);
    }
  }

  void loop() {
    while (!stopping) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) continue;
      if (active.load() >= 64) {  // bounded: the admin port must not become a thread bomb
        reply(fd, 503, "text/plain", "busy\n");
        ::close(fd);
        continue;
      }
      ++active;
      std::thread([this, fd] {
        serve(fd);
        ::close(fd);
        --active;
      }).detach();
    }
  }
};

HttpAdmin::HttpAdmin(const std::string& address, HttpHandlers handlers)
    : impl_(std::make_unique<Impl>()) {
  impl_->handlers = std::move(handlers);
  const auto [host, port] = split_address(address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0) {
    throw std::runtime_error("HTTP admin: cannot resolve " + address + ": " + gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (impl_->listen_fd < 0)
    throw std::runtime_error("HTTP admin: cannot listen on " + address + ": " + error);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl_->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl_->acceptor = std::thread([this] { impl_->loop(); });
  log::info("HTTP admin listening on " + address + " (port " + std::to_string(impl_->port) + ")");
}

HttpAdmin::~HttpAdmin() {
  impl_->stopping = true;
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  ::close(impl_->listen_fd);
  // Connection threads hold `impl_`: wait for them (each ends within its kHeadSeconds read
  // deadline plus the time to answer).
  for (int i = 0; i < 600 && impl_->active.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

int HttpAdmin::port() const { return impl_->port; }

}  // namespace libreyolo::server
