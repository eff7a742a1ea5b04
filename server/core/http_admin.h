// The HTTP admin port: GET /active (JSON), /metrics (Prometheus text),
// /v2/health/live and /v2/health/ready (200 or 503, KServe v2 REST health). No torch here.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace libreyolo::server {

struct HttpHandlers {
  std::function<bool()> live;
  std::function<bool()> ready;
  std::function<std::string()> active_json;
  std::function<std::string()> metrics_text;
};

class HttpAdmin {
 public:
  /// Listens on `address` ("host:port"; port 0 picks a free one). Throws std::runtime_error
  /// when it cannot bind.
  HttpAdmin(const std::string& address, HttpHandlers handlers);
  ~HttpAdmin();
  HttpAdmin(const HttpAdmin&) = delete;
  HttpAdmin& operator=(const HttpAdmin&) = delete;
  /// The port bound.
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server
