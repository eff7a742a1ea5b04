// libFuzzer entry: the bytes one client sends on one connection, through the HTTP port's
// connection loop (server/http/acceptor.cpp: ConnectionStream's head deadline, head and body
// budgets, keep-alive and pipelining, the Range header hidden from httplib) and cpp-httplib's
// request parser (request line, headers, Content-Length and chunked bodies, multipart forms),
// over a socketpair, with a small route table shaped like the daemon's
// (server/http/http_server.cpp: a pre-routing handler that answers GETs, POSTs read through a
// content reader, and httplib's own body reading for one route). No model, no torch. Checks beyond
// "no crash": httplib never sees a Range header and never answers 416 (API answers ignore Range);
// every answer the client receives starts with an HTTP/1.1 status line.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "fuzz_util.h"
#include "server/http/acceptor.h"
#include "server/http/reply.h"

using namespace libreyolo::server;
using libreyolo::fuzz::fail;

namespace {

constexpr std::size_t kMaxBody = 4096;  // small, so that 413 paths are reached

http::Server& server() {
  static http::Server* s = [] {
    http::HttpOptions o;
    o.threads = 1;
    o.max_waiting = 1;
    o.max_body_bytes = kMaxBody;
    o.stack_bytes = 1u << 20;
    // Every byte is there before the loop starts (then the end of the stream): these bound only
    // a write to a client that stopped reading, which the client thread below never does.
    o.head_seconds = 10;
    o.io_seconds = 10;
    auto* srv = new http::Server(o);
    srv->set_payload_max_length(kMaxBody);
    srv->set_keep_alive_max_count(http::kMaxRequestsPerConnection);
    srv->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (req.has_header("Range") || !req.ranges.empty())
        fail("httplib saw a Range header: " + req.get_header_value("Range"));
      if (req.path == "/v2/health/ready" && (req.method == "GET" || req.method == "HEAD")) {
        http::send_json(res, 200, "{\"ready\":true}");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (req.path == "/big" && req.method == "GET") {  // an answer larger than a socket write
        http::send_json(res, 200, std::string(100000, ' ') + "{}");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (req.path == "/close") {  // answered before the body: the connection ends
        if (http::tl_connection) http::tl_connection->close_after = true;
        res.set_header("Connection", "close");
        http::send_error(res, 403, "denied");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // The daemon's POST endpoints: the body through the content reader, capped.
    srv->Post("/v2/models/m/infer", [](const httplib::Request&, httplib::Response& res,
                                       const httplib::ContentReader& reader) {
      std::string body;
      const bool ok = reader([&](const char* data, std::size_t n) {
        if (body.size() + n > kMaxBody) return false;
        body.append(data, n);
        return true;
      });
      if (!ok) {
        if (http::tl_connection) http::tl_connection->close_after = true;
        res.set_header("Connection", "close");
        return http::send_error(res, 413, "too large");
      }
      http::send_json(res, 200, "{\"bytes\":" + std::to_string(body.size()) + "}");
    });
    // httplib's own body reading (forms, multipart) for one route.
    srv->Post("/form", [](const httplib::Request& req, httplib::Response& res) {
      http::send_json(res, 200,
                      "{\"bytes\":" + std::to_string(req.body.size()) +
                          ",\"files\":" + std::to_string(req.files.size()) + "}");
    });
    srv->set_error_handler(
        httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
          if (res.status == 416) fail("416: a Range reached httplib");
          if (http::tl_connection) {
            http::tl_connection->close_after = true;
            res.set_header("Connection", "close");
          }
          http::send_error(res, res.status, http::reason_phrase(res.status));
          return httplib::Server::HandlerResponse::Handled;
        }));
    srv->set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          http::send_error(res, 500, "internal error");
        });
    return srv;
  }();
  return *s;
}

/// The client: writes `in`, ends its side, and reads every answer until the server closes.
std::string client(int fd, const std::uint8_t* in, std::size_t size) {
  std::string out;
  std::size_t sent = 0;
  char buf[65536];
  bool write_open = true;
  if (size == 0) {
    ::shutdown(fd, SHUT_WR);
    write_open = false;
  }
  for (;;) {
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, -1) < 0) continue;
    if (write_open && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t n = ::send(fd, in + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) sent = size;  // the server closed
      if (sent == size) {
        ::shutdown(fd, SHUT_WR);
        write_open = false;
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  http::Server& s = server();
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) fail("socketpair");
  std::string answers;
  std::thread peer([&] { answers = client(fds[1], data, size); });
  (void)s.serve_connection(fds[0]);  // closes fds[0]
  peer.join();
  if (!answers.empty() && answers.compare(0, 9, "HTTP/1.1 ") != 0)
    fail("the first answer is not an HTTP/1.1 status line: " + answers.substr(0, 40));
  return 0;
}
