// What a request's path names (the KServe v2 REST routes, Triton's extensions and the admin
// endpoints), decided from the path alone before any body is read.
#pragma once

#include <httplib.h>

#include <string>

#include "server/security/access_policy.h"

namespace libreyolo::server::http {

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
  /// The API group server.restricted_apis rules this route by (none: inference, never asked).
  security::ApiGroup group() const;
  bool post() const {
    return kind == repository_index || kind == load || kind == unload || kind == infer ||
           kind == shm_register || kind == shm_unregister;
  }
};

/// The route of `path` (Route::none when it names nothing).
Route route_of(const std::string& path);

/// Whether the request announces a body (Transfer-Encoding, or a Content-Length other than 0).
bool has_body(const httplib::Request& req);

}  // namespace libreyolo::server::http
