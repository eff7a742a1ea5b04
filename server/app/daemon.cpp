#include "server/app/daemon.h"

#include <c10/util/StringUtil.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "kernels/kernels.h"
#include "log/log.h"
#include "models/runtime/device_memory.h"
#include "server/grpc/grpc_server.h"
#include "server/http/http_server.h"
#include "server/security/access_policy.h"
#include "server/security/tls.h"
#include "server/shm/registry.h"

namespace libreyolo::server {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool http_off(const std::string& a) { return a.empty() || a == "off" || a == "none"; }

/// The one warning for plain text beyond loopback (the default 0.0.0.0 addresses included).
void warn_plain_text(const ServerConfig& c) {
  if (c.tls.value.enabled()) return;
  std::string open;
  if (!security::is_loopback_address(c.grpc_address.value)) open = "gRPC " + c.grpc_address.value;
  if (!http_off(c.http_address.value) && !security::is_loopback_address(c.http_address.value))
    open += (open.empty() ? "HTTP " : ", HTTP ") + c.http_address.value;
  if (open.empty()) return;
  log::warn("listening beyond loopback without TLS (" + open +
            "): requests, answers and restricted_apis header values cross the network in plain "
            "text; set server.tls (docs/OPERATIONS.md \"Securing the daemon\")");
}

}  // namespace

struct Daemon::Impl {
  ServerConfig config;
  Metrics metrics;
  std::unique_ptr<ServerCore> core;
  /// The shared-memory regions of both transports (Triton's extensions): one registry, so a
  /// region registered over gRPC is usable over REST and the converse. Declared before the
  /// servers: destroyed after them.
  shm::Registry shm_registry;
  /// server.restricted_apis for both transports; declared before them: outlives them.
  std::unique_ptr<security::AccessPolicy> access;
  /// The HTTP port's TLS context (server.tls), null for plain text.
  std::shared_ptr<security::TlsContext> tls;
  std::unique_ptr<rpc::GrpcServer> grpc;
  std::unique_ptr<http::HttpServer> http;
  bool stopped = false;

  // Readiness after start-up changes with model control (RepositoryModelLoad/Unload) and the
  // drain; this thread keeps grpc.health.v1 "readiness" equal to ServerCore::ready().
  std::thread monitor;
  std::mutex monitor_mu;
  std::condition_variable monitor_cv;
  bool monitor_stop = false;

  void watch_readiness(bool last) {
    std::unique_lock<std::mutex> lk(monitor_mu);
    while (!monitor_cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return monitor_stop; })) {
      const bool now = core->ready();
      if (now == last) continue;
      last = now;
      grpc->set_ready(now);
      log::info(std::string("readiness: ") + (now ? "SERVING" : "NOT_SERVING") +
                (core->draining() ? " (draining)" : " (model repository changed)"));
    }
  }
  void stop_monitor() {
    {
      std::lock_guard<std::mutex> lk(monitor_mu);
      monitor_stop = true;
    }
    monitor_cv.notify_all();
    if (monitor.joinable()) monitor.join();
  }
};

Daemon::Daemon(ServerConfig config, ModelFactory factory) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->core = std::make_unique<ServerCore>(impl_->config, impl_->metrics, std::move(factory));
}

Daemon::~Daemon() { stop(0.0); }

void Daemon::start(const std::function<void()>& on_serving) {
  const auto start = Clock::now();
  auto t = Clock::now();
  // initialize() logs the effective policy (with sources) and the resolved table.
  kernels::initialize(impl_->config.kernels);
  log::info(c10::str("start-up: kernels resolved in ", since(t), " s"));

  t = Clock::now();
  impl_->access = std::make_unique<security::AccessPolicy>(impl_->config.restricted_apis.value);
  if (impl_->config.tls.value.enabled())
    impl_->tls = std::make_shared<security::TlsContext>(impl_->config.tls.value);  // throws
  warn_plain_text(impl_->config);
  rpc::GrpcOptions options;
  options.tls = impl_->config.tls.value;
  options.access = impl_->access.get();
  options.address = impl_->config.grpc_address.value;
  options.max_message_bytes = static_cast<std::size_t>(impl_->config.max_message_bytes.value);
  options.max_threads = static_cast<int>(impl_->config.max_concurrent_rpcs.value);
  options.shm_registry = &impl_->shm_registry;
  impl_->grpc = std::make_unique<rpc::GrpcServer>(*impl_->core, options);
  if (!http_off(impl_->config.http_address.value)) {
    auto* core = impl_->core.get();
    auto* metrics = &impl_->metrics;
    const auto* access = impl_->access.get();
    http::AdminHandlers admin;
    admin.active_json = [core] { return core->active_json(); };
    // GPU memory is read at scrape time, for the devices the instances use only.
    admin.metrics_text = [metrics, core, access] {
      return metrics->serialize(models::device_memory(core->instance_devices()), access);
    };
    http::HttpOptions http_options;
    http_options.address = impl_->config.http_address.value;
    http_options.max_body_bytes = options.max_message_bytes;
    http_options.threads = static_cast<int>(impl_->config.http_threads.value);
    http_options.shm_registry = &impl_->shm_registry;
    http_options.tls = impl_->tls;
    http_options.access = access;
    impl_->http = std::make_unique<http::HttpServer>(*core, http_options, std::move(admin));
  }
  log::info(c10::str("start-up: listening in ", since(t), " s"));

  t = Clock::now();
  const int ready = impl_->core->load_repository();
  log::info(c10::str("start-up: repository loaded and warmed up in ", since(t), " s (", ready,
                     " models ready)"));
  if (on_serving) on_serving();
  const bool is_ready = impl_->core->ready();
  impl_->grpc->set_ready(is_ready);
  impl_->monitor = std::thread([impl = impl_.get(), is_ready] { impl->watch_readiness(is_ready); });
  if (is_ready) {
    log::info(c10::str("start-up: ready after ", since(start), " s"));
  } else {
    log::warn(c10::str("start-up: NOT ready after ", since(start),
                       " s (a model failed to load; the others serve)"));
  }
}

int Daemon::grpc_port() const { return impl_->grpc ? impl_->grpc->port() : 0; }
int Daemon::http_port() const { return impl_->http ? impl_->http->port() : 0; }
ServerCore& Daemon::core() { return *impl_->core; }
Metrics& Daemon::metrics() { return impl_->metrics; }

void Daemon::reload_certificates() {
  if (!impl_->config.tls.value.enabled()) {
    log::info("SIGHUP: no server.tls, nothing to reload");
    return;
  }
  if (!impl_->tls) {  // HTTP off: gRPC watches the files itself
    log::info("SIGHUP: the gRPC port re-reads the certificate files within " +
              std::to_string(security::kTlsRefreshSeconds) + " s");
    return;
  }
  const std::string error = impl_->tls->reload();
  if (error.empty()) {
    log::info("SIGHUP: certificate files reloaded (HTTP now; gRPC within " +
              std::to_string(security::kTlsRefreshSeconds) + " s)");
  } else {
    log::error("SIGHUP: the certificate files cannot be used, keeping the previous ones: " + error);
  }
}

void Daemon::begin_drain() {
  {
    // Under the monitor's lock: it must not publish a readiness read before the drain began.
    std::lock_guard<std::mutex> lk(impl_->monitor_mu);
    impl_->core->begin_drain();
    if (impl_->grpc) impl_->grpc->set_ready(false);
  }
  log::info("drain: readiness is NOT_SERVING; still serving requests");
}

void Daemon::stop(double grace_seconds) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->stop_monitor();
  impl_->core->begin_drain();
  const auto t = Clock::now();
  if (impl_->grpc) impl_->grpc->shutdown(grace_seconds);
  impl_->http.reset();
  impl_->grpc.reset();
  log::info(c10::str("stopped: in-flight requests finished in ", since(t), " s"));
}

}  // namespace libreyolo::server
