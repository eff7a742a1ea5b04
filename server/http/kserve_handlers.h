// The KServe v2 REST endpoints (Open Inference Protocol over HTTP) with Triton's binary tensor
// data and its model repository, statistics and shared-memory extensions: each request decoded
// by the codec (kserve_json.h), run on the api::InferenceService as the gRPC transport does, and
// answered.
#pragma once

#include <httplib.h>

#include <string>

#include "server/api/types.h"
#include "server/http/peer_watcher.h"
#include "server/http/router.h"
#include "server/shm/registry.h"

namespace libreyolo::server::http {

class KServeHandlers {
 public:
  /// All three must outlive the handlers.
  KServeHandlers(api::InferenceService& core, shm::Registry& registry, PeerWatcher& watcher)
      : core_(core), registry_(registry), watcher_(watcher) {}

  /// A GET route: metadata, readiness of a model, configuration, statistics, shared-memory
  /// status; 404 for any other. Throws api::Error from the core.
  void get(const Route& r, httplib::Response& res);

  /// A POST route with its whole body: repository index, load, unload, infer, shared-memory
  /// register and unregister; 404 for any other. Throws api::Error from the codec and the core.
  void post(const Route& r, const httplib::Request& req, const std::string& body,
            httplib::Response& res);

 private:
  void register_region(const Route& r, const std::string& body, httplib::Response& res);
  void infer(const Route& r, const httplib::Request& req, const std::string& body,
             httplib::Response& res);

  api::InferenceService& core_;
  shm::Registry& registry_;
  PeerWatcher& watcher_;
};

}  // namespace libreyolo::server::http
