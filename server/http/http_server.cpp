// The HTTP port put together: the acceptor (acceptor.h) hands each request to one pre-routing
// handler, which decides it from its path and method (router.h; 404, 405, 411, 413, 415 before
// any body is read) and dispatches it to the admin endpoints (admin_handlers.h) or the KServe
// ones (kserve_handlers.h); only the POST endpoints read their body. api::Error becomes its HTTP
// status (kserve_json.h http_status), anything else 500, always with a JSON error body.
#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "log/log.h"
#include "server/http/acceptor.h"
#include "server/http/admin_handlers.h"
#include "server/http/fixed_stack_thread.h"
#include "server/http/kserve_handlers.h"
#include "server/http/kserve_json.h"
#include "server/http/peer_watcher.h"
#include "server/http/reply.h"
#include "server/http/router.h"
#include "server/security/access_policy.h"
#include "server/shm/registry.h"

namespace libreyolo::server::http {

struct HttpServer::Impl {
  api::InferenceService* core = nullptr;
  std::unique_ptr<shm::Registry> own_registry;  ///< when HttpOptions::shm_registry is null
  shm::Registry* registry = nullptr;
  AdminHandlers admin;
  HttpOptions options;
  std::unique_ptr<PeerWatcher> watcher;  ///< before server: outlives the requests
  std::unique_ptr<KServeHandlers> kserve;
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
    // API answers are whole JSON documents: a Range header must not cut one (httplib applies
    // parsed ranges to every answer; the acceptor already hides the header from httplib,
    // acceptor.cpp hide_range_header). The request object is ours (httplib's local), not const.
    const_cast<httplib::Request&>(req).ranges.clear();
    // Request smuggling (RFC 9112 section 6.3): a proxy in front may frame a message with both
    // Transfer-Encoding and Content-Length, or with two lengths, differently than we would.
    if (req.has_header("Transfer-Encoding") && req.has_header("Content-Length"))
      return early(400, "Content-Length and Transfer-Encoding together are not accepted");
    for (std::size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i) {
      if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length"))
        return early(400, "differing Content-Length headers");
    }
    if (r.kind == Route::none) return early(404, "not found: " + shown_path(req.path));
    if (options.access) {
      const std::string why = options.access->check(
          r.group(), security::Protocol::http,
          [&req](const std::string& name) -> std::optional<std::string> {
            if (!req.has_header(name.c_str())) return std::nullopt;
            return req.get_header_value(name.c_str());
          },
          security::is_loopback_peer(req.remote_addr));
      if (!why.empty()) return early(403, why);
    }
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
    if (serve_admin(r, *core, admin, res)) return;
    kserve->get(r, res);
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
    guarded(req, res, [&] { kserve->post(r, req, body, res); });
  }

  /// Responses httplib makes itself (400 malformed request, 414, a body that could not be
  /// read) get the JSON error body too; the connection ends after them.
  httplib::Server::HandlerResponse on_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (tl_connection) {
      tl_connection->close_after = true;
      res.set_header("Connection", "close");
      if (tl_connection->head_too_large) {
        res.status = 431;
        send_error(
            res, 431,
            "the request line and headers exceed " + std::to_string(kMaxHeadBytes) + " bytes");
        return httplib::Server::HandlerResponse::Handled;
      }
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
  impl_->kserve = std::make_unique<KServeHandlers>(service, *impl_->registry, *impl_->watcher);
  impl_->server = std::make_unique<Server>(options);
  auto& s = *impl_->server;
  Impl* impl = impl_.get();
  // httplib's default sets SO_REUSEPORT: a second daemon could bind the same port and take
  // half of the connections (the gRPC side had that bug). SO_REUSEADDR only.
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
  if (const std::string error = s.raise_backlog(); !error.empty())
    log::warn("HTTP: the listen backlog stays at httplib's 5 (" + error +
              "): bursts of new connections may wait 1 s for a retransmitted handshake");
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
            " worker threads" +
            (options.tls ? (options.tls->files().mutual() ? "; mutual TLS" : "; TLS") : "") + ")");
}

HttpServer::~HttpServer() {
  impl_->server->stopping = true;
  impl_->server->stop();  // closes the listening socket; listen_after_bind joins the workers
  impl_->listener.reset();
}

int HttpServer::port() const { return impl_->port; }

}  // namespace libreyolo::server::http
