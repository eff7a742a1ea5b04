#include "server/core/http_admin.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "log/log.h"

namespace libreyolo::server {
namespace {

void reply(mg_connection* conn, int status, const char* type, const std::string& body) {
  const char* reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 503 ? "Service Unavailable" : "Error";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
            status, reason, type, body.size());
  mg_write(conn, body.data(), body.size());
}

}  // namespace

struct HttpAdmin::Impl {
  HttpHandlers handlers;
  mg_context* ctx = nullptr;
  int port = 0;

  static int handle(mg_connection* conn, void* data) {
    auto* self = static_cast<Impl*>(data);
    const mg_request_info* info = mg_get_request_info(conn);
    const std::string uri = info->local_uri ? info->local_uri : "";
    try {
      if (uri == "/v2/health/live") {
        const bool ok = self->handlers.live();
        reply(conn, ok ? 200 : 503, "application/json", ok ? "{\"live\":true}" : "{\"live\":false}");
      } else if (uri == "/v2/health/ready") {
        const bool ok = self->handlers.ready();
        reply(conn, ok ? 200 : 503, "application/json", ok ? "{\"ready\":true}" : "{\"ready\":false}");
      } else if (uri == "/active") {
        reply(conn, 200, "application/json", self->handlers.active_json());
      } else if (uri == "/metrics") {
        reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", self->handlers.metrics_text());
      } else {
        reply(conn, 404, "text/plain", "not found: " + uri + "\n");
      }
    } catch (const std::exception& e) {
      log::error("HTTP " + uri + ": " + e.what());
      reply(conn, 500, "text/plain", std::string("internal error: ") + e.what() + "\n");
    }
    return 1;
  }
};

HttpAdmin::HttpAdmin(const std::string& address, HttpHandlers handlers)
    : impl_(std::make_unique<Impl>()) {
  impl_->handlers = std::move(handlers);
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "4", nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = [](const mg_connection*, const char* message) {
    log::warn(std::string("HTTP admin (civetweb): ") + message);
    return 1;
  };
  char error[256] = {0};
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.configuration_options = options;
  mg_error_data err;
  std::memset(&err, 0, sizeof(err));
  err.text = error;
  err.text_buffer_size = sizeof(error);
  impl_->ctx = mg_start2(&init, &err);
  if (!impl_->ctx) throw std::runtime_error("HTTP admin: cannot listen on " + address + ": " + error);
  mg_set_request_handler(impl_->ctx, "/", &Impl::handle, impl_.get());
  mg_server_port ports[4];
  const int n = mg_get_server_ports(impl_->ctx, 4, ports);
  if (n > 0) impl_->port = ports[0].port;
  log::info("HTTP admin listening on " + address + " (port " + std::to_string(impl_->port) + ")");
}

HttpAdmin::~HttpAdmin() {
  if (impl_->ctx) mg_stop(impl_->ctx);
}

int HttpAdmin::port() const { return impl_->port; }

}  // namespace libreyolo::server
