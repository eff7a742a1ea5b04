// The gRPC front end: inference.GRPCInferenceService and grpc.health.v1.Health on one port,
// forwarding to an api::InferenceService. No gRPC, protobuf or torch type in this header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/api/types.h"

namespace libreyolo::server::rpc {

struct GrpcOptions {
  std::string address = "0.0.0.0:8001";       ///< host:port; port 0 picks a free one
  std::size_t max_message_bytes = 64u << 20;  ///< receive and send limit
  int threads = 0;                            ///< sync server threads (0: gRPC's default)
  /// Most threads the sync server runs (grpc::ResourceQuota::SetMaxThreads, pollers included).
  /// A call arriving when all are busy is answered RESOURCE_EXHAUSTED ("Server Threadpool
  /// Exhausted") instead of starting one more thread that holds one more request: without a cap,
  /// N concurrent 64 MiB requests held N threads and about 2N x 64 MiB of memory. The daemon
  /// sets it from server.max_concurrent_rpcs.
  int max_threads = 256;
};

/// A running gRPC server. Health services "", "liveness" and "readiness" are registered;
/// "" and "readiness" follow set_ready(), "liveness" is SERVING while the server runs.
class GrpcServer {
 public:
  /// Binds and starts. Throws std::runtime_error "gRPC: cannot listen on <address> (...)" when
  /// the address cannot be bound, also when another process listens on it (SO_REUSEPORT is
  /// off: two daemons never split one port's connections) and when a name resolving to several
  /// addresses bound another port than the one asked for.
  GrpcServer(api::InferenceService& service, const GrpcOptions& options);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  /// The port actually bound (useful with port 0).
  int port() const;
  /// Readiness as seen by grpc.health.v1 ("" and "readiness").
  void set_ready(bool ready);
  /// Stops accepting new calls and waits up to `grace_seconds` for in-flight ones, then cancels.
  void shutdown(double grace_seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server::rpc
