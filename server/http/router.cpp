#include "server/http/router.h"

#include <vector>

namespace libreyolo::server::http {
namespace {

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

}  // namespace

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

bool has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

security::ApiGroup Route::group() const {
  using G = security::ApiGroup;
  switch (kind) {
    case live:
    case ready:
    case model_ready:
      return G::health;
    case server_metadata:
    case model_metadata:
      return G::metadata;
    case model_config:
      return G::model_config;
    case all_stats:
    case model_stats:
      return G::statistics;
    case repository_index:
    case load:
    case unload:
      return G::model_repository;
    case shm_status:
    case shm_register:
    case shm_unregister:
      return G::shared_memory;
    case active:
      return G::admin;
    case metrics:
      return G::metrics;
    case infer:
    case none:
      break;
  }
  return G::inference;
}

}  // namespace libreyolo::server::http
