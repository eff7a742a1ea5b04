// grpc.health.v1.Health for the gRPC transport (grpc_server.h), on the callback API.
// This header sees gRPC and Debian's protobuf, never torch.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace libreyolo::server::rpc {

namespace hpb = ::grpc::health::v1;

/// grpc.health.v1.Health on the callback API, replacing gRPC's default health service: its
/// Watch streams never end on their own, so grpc::Server::Shutdown waited the whole grace
/// period for every idle Watch (SIGTERM -> exit took the whole grace with one Watch open).
/// Here shutdown() finishes every Watch (status OK after a last NOT_SERVING message) before the
/// server shuts down. Check of an unknown service is NOT_FOUND, Watch of one streams
/// SERVICE_UNKNOWN (grpc/health/v1/health.proto; what gRPC's default service answers).
class HealthService final : public hpb::Health::CallbackService {
 public:
  class Watcher;

  /// At most `max_watches` Watch streams open at once (GrpcOptions::max_health_watches): each
  /// holds a call, a reactor and a connection's stream for as long as the client wants, so an
  /// unbounded number was a way to exhaust the server. One more is answered RESOURCE_EXHAUSTED.
  explicit HealthService(std::size_t max_watches = 1024) : max_watches_(max_watches) {
    for (const char* s : {"", "liveness", "readiness"})
      status_[s] = hpb::HealthCheckResponse::NOT_SERVING;
  }

  /// Sets a service's status and sends it to its watchers (after shutdown(): ignored).
  void set(const std::string& service, bool serving);
  /// Every status NOT_SERVING, sent to every watcher, then every Watch finished; later Watch
  /// calls finish at once.
  void shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const hpb::HealthCheckRequest* in,
                                  hpb::HealthCheckResponse* out) override {
    auto* reactor = ctx->DefaultReactor();
    std::lock_guard<std::mutex> lk(mu_);
    auto it = status_.find(in->service());
    if (it == status_.end()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown"));
    } else {
      out->set_status(it->second);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  grpc::ServerWriteReactor<hpb::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx, const hpb::HealthCheckRequest* in) override;

 private:
  friend class Watcher;
  hpb::HealthCheckResponse::ServingStatus status_of(const std::string& service) const {
    auto it = status_.find(service);
    return it == status_.end() ? hpb::HealthCheckResponse::SERVICE_UNKNOWN : it->second;
  }

  std::mutex mu_;  // status_, watchers_, shut_down_
  std::map<std::string, hpb::HealthCheckResponse::ServingStatus> status_;
  std::set<Watcher*> watchers_;
  const std::size_t max_watches_;
  bool shut_down_ = false;
};

}  // namespace libreyolo::server::rpc
