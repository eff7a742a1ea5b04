// The daemon's life cycle, shared by main() and the in-process integration tests:
// policy -> resolve kernels -> listen (gRPC + HTTP admin; liveness from here on) -> load the
// repository (models in parallel) -> warm-up -> ready; then drain -> stop. Every step is logged
// with its duration. No torch in this header.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/config/config.h"
#include "server/core/core.h"

namespace libreyolo::server {

class Daemon {
 public:
  explicit Daemon(ServerConfig config, ModelFactory factory = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  /// Runs the start-up sequence. Throws std::runtime_error when a port cannot be bound.
  /// Returns when every model is loaded (or failed); readiness is then true iff all are ready.
  /// From then on gRPC health "readiness" follows ServerCore::ready() within 100 ms (models
  /// loaded or unloaded by RepositoryModelLoad/Unload). `on_serving`, when set, is called once
  /// the repository is loaded and before readiness is first published (main: from then on a
  /// signal drains instead of ending the start-up; a probe may see SERVING right after).
  void start(const std::function<void()>& on_serving = {});

  int grpc_port() const;
  int http_port() const;  ///< 0 when the HTTP admin port is off
  ServerCore& core();
  Metrics& metrics();

  /// Re-reads the TLS certificate files (SIGHUP): the HTTP port at once (its next connections;
  /// open ones keep theirs), the gRPC port within security::kTlsRefreshSeconds (gRPC watches
  /// the files itself). Logs the outcome; files that cannot be used keep the previous
  /// certificate. Without TLS: logs that there is nothing to reload.
  void reload_certificates();

  /// Readiness NOT_SERVING from now on (gRPC health, ServerReady, /v2/health/ready); requests
  /// are still served.
  void begin_drain();
  /// Stops accepting calls, waits up to `grace_seconds` for in-flight ones, stops HTTP.
  void stop(double grace_seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server
