// The gRPC front end: inference.GRPCInferenceService and grpc.health.v1.Health on one port,
// forwarding to an api::InferenceService. No gRPC, protobuf or torch type in this header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/api/types.h"
#include "server/security/tls.h"

namespace libreyolo::server::shm {
class Registry;
}
namespace libreyolo::server::security {
class AccessPolicy;
}

namespace libreyolo::server::rpc {

struct GrpcOptions {
  std::string address = "0.0.0.0:8001";       ///< host:port; port 0 picks a free one
  std::size_t max_message_bytes = 64u << 20;  ///< receive and send limit
  /// Most calls that may block at once (ModelInfer, model load/unload, CUDA shared-memory
  /// register): they run on a bounded executor of this many threads, never on gRPC's callback
  /// threads. A call arriving when all are busy is answered RESOURCE_EXHAUSTED "server busy: N
  /// calls in progress (server.max_concurrent_rpcs)" at once instead of holding its request in
  /// memory (without a bound, N concurrent 64 MiB requests held about 2N x 64 MiB). The daemon
  /// sets it from server.max_concurrent_rpcs.
  int max_threads = 256;
  /// The shared-memory regions the server reads inputs from and writes outputs to (shared with
  /// the other transports); null: the server keeps its own.
  shm::Registry* shm_registry = nullptr;
  /// grpc.health.v1 Watch streams open at once; one more is answered RESOURCE_EXHAUSTED.
  int max_health_watches = 1024;
  /// TLS when tls.enabled(): the files are checked at start-up and watched for a renewal every
  /// security::kTlsRefreshSeconds (gRPC's FileWatcherCertificateProvider; open connections keep
  /// theirs); with client_ca_file, clients without a certificate that CA signed fail the
  /// handshake.
  security::TlsFiles tls;
  /// Who may call what (server.restricted_apis): a denied call is answered PERMISSION_DENIED
  /// before it runs. grpc.health.v1 stays open (Kubernetes probes). Null: every API open. Must
  /// outlive the server.
  const security::AccessPolicy* access = nullptr;
};

/// A running gRPC server (gRPC's callback API): GRPCInferenceService, including Triton's
/// system and CUDA shared-memory RPCs, and health services "", "liveness" and "readiness";
/// "" and "readiness" follow set_ready(), "liveness" is SERVING while the server runs.
class GrpcServer {
 public:
  /// Binds and starts. Throws std::runtime_error "TLS: ..." for certificate files that cannot
  /// be used, and "gRPC: cannot listen on <address> (...)" when
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
  /// Stops: every new GRPCInferenceService call is answered UNAVAILABLE "the server is shutting
  /// down" (the port stays open) until the calls in flight are done or `grace_seconds` passed;
  /// then gRPC shuts down (the port closes; health Watch streams end), cancelling what still runs.
  /// gRPC's own Shutdown answers a call reaching it CANCELLED: with the refusals first, only a
  /// call on the wire within a round trip of that instant can still get it (gRPC 1.51 has no
  /// way to close connections without it).
  void shutdown(double grace_seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server::rpc
