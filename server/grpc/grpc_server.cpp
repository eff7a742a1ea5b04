// GRPCInferenceService implementation: protobuf <-> api types, status mapping; the health service
// is health_service.h.
// This translation unit sees gRPC and Debian's protobuf, never torch.
#include "server/grpc/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "log/log.h"
#include "server/grpc/deadline_timer.h"
#include "server/grpc/executor.h"
#include "server/grpc/health_service.h"
#include "server/grpc/infer_request.h"
#include "server/security/access_policy.h"
#include "server/shm/registry.h"
#include "server/shm/tensor_params.h"

namespace libreyolo::server::rpc {
namespace {

namespace pb = ::inference;

/// Longest status message sent, bytes. The message travels in the grpc-message trailer and
/// clients refuse metadata above 8 KiB (grpc.max_metadata_size): a longer one reached the client
/// as RESOURCE_EXHAUSTED "received metadata size exceeds limit" instead of the real status. The
/// core clips the names it echoes (server/repository/model_name.h quoted_name); this is the net for
/// any other echoed text (input and output names).
constexpr std::size_t kMaxStatusMessageBytes = 2048;

grpc::Status to_status(const api::Error& e) {
  std::string message = e.what();
  if (message.size() > kMaxStatusMessageBytes) {
    const std::size_t total = message.size();
    message.resize(kMaxStatusMessageBytes);
    message += "... (" + std::to_string(total) + " bytes, clipped)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(e.code())), message);
}

api::InferRequest to_api(const pb::ModelInferRequest& r, const grpc::CallbackServerContext& ctx,
                         const shm::Registry& registry, CallRegions& regions) {
  api::InferRequest out = to_infer_request(r, registry, regions);
  const gpr_timespec raw_deadline = ctx.raw_deadline();
  if (gpr_time_cmp(raw_deadline, gpr_inf_future(raw_deadline.clock_type)) != 0) {
    const auto left = ctx.deadline() - std::chrono::system_clock::now();
    out.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  }
  return out;
}

/// Fills the ModelInfer response: outputs in host memory first, each with its
/// raw_output_contents entry, then the outputs written into shared memory (Triton's
/// behaviour: no raw_output_contents entry; the output's parameters name the region, offset and
/// bytes written). Shared-memory outputs last keep every raw entry at its output's index, which
/// is how tritonclient's InferResult.as_numpy finds it.
void fill_response(api::InferResponse& response, CallRegions& regions,
                   pb::ModelInferResponse* out) {
  out->set_model_name(response.model_name);
  out->set_model_version(response.model_version);
  out->set_id(response.id);
  std::vector<std::pair<api::OutputTensor*, shm::OutputRegion*>> in_shm;
  for (auto& t : response.outputs) {
    shm::OutputRegion* target = nullptr;
    for (auto& so : regions.outputs)
      if (so.name == t.name) target = &so;
    if (target) {
      shm::check_output(t, *target);
      in_shm.emplace_back(&t, target);
      continue;
    }
    auto* o = out->add_outputs();
    o->set_name(t.name);
    o->set_datatype(t.datatype);
    for (auto d : t.shape) o->add_shape(d);
    out->add_raw_output_contents(std::move(t.data));
  }
  for (auto& [t, so] : in_shm) {
    shm::write_output(*t, *so);
    auto* o = out->add_outputs();
    o->set_name(t->name);
    o->set_datatype(t->datatype);
    for (auto d : t->shape) o->add_shape(d);
    auto& params = *o->mutable_parameters();
    for (const auto& [key, value] : shm::output_params(*t, *so)) {
      if (const auto* text = std::get_if<std::string>(&value)) {
        params[key].set_string_param(*text);
      } else {
        params[key].set_int64_param(std::get<std::int64_t>(value));
      }
    }
  }
}

void fill_tensor(const api::TensorMetadata& t, pb::ModelMetadataResponse::TensorMetadata* out) {
  out->set_name(t.name);
  out->set_datatype(t.datatype);
  for (auto d : t.shape) out->add_shape(d);
}

pb::DataType to_pb_type(const std::string& dt) {
  static const std::map<std::string, pb::DataType> m = {
      {"BOOL", pb::TYPE_BOOL},     {"UINT8", pb::TYPE_UINT8},   {"UINT16", pb::TYPE_UINT16},
      {"UINT32", pb::TYPE_UINT32}, {"UINT64", pb::TYPE_UINT64}, {"INT8", pb::TYPE_INT8},
      {"INT16", pb::TYPE_INT16},   {"INT32", pb::TYPE_INT32},   {"INT64", pb::TYPE_INT64},
      {"FP16", pb::TYPE_FP16},     {"FP32", pb::TYPE_FP32},     {"FP64", pb::TYPE_FP64},
      {"BYTES", pb::TYPE_STRING},  {"BF16", pb::TYPE_BF16}};
  auto it = m.find(dt);
  return it == m.end() ? pb::TYPE_INVALID : it->second;
}

void fill_duration(const api::Duration& d, pb::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

/// Runs `body`, mapping api::Error to its status and anything else to INTERNAL.
template <class F>
grpc::Status guarded(const char* rpc, F&& body) {
  try {
    body();
    return grpc::Status::OK;
  } catch (const api::Error& e) {
    return to_status(e);
  } catch (const std::exception& e) {
    log::error(std::string(rpc) + ": internal error: " + e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  } catch (...) {
    log::error(std::string(rpc) + ": internal error (unknown exception)");
    return grpc::Status(grpc::StatusCode::INTERNAL, "unknown exception");
  }
}

class Service;

/// One ModelInfer: gRPC's callback thread creates it and hands run() to the executor; OnCancel
/// (client cancellation, or gRPC's own deadline) and the deadline timer notify the core through
/// the call's CancelToken. gRPC deletes it (OnDone) after Finish and any OnCancel returned.
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(Service& service, grpc::CallbackServerContext* ctx, const pb::ModelInferRequest* in,
            pb::ModelInferResponse* out)
      : service_(service), ctx_(ctx), in_(in), out_(out) {}

  void OnCancel() override {
    // gRPC cancels a call whose deadline passed as well: that one is DEADLINE_EXCEEDED. The
    // client's own deadline cancels the stream up to the request's transit time before the
    // server's deadline (computed from grpc-timeout on arrival), so a cancel within
    // kDeadlineSlack of it counts as the deadline (seen under load: ServerGrpc.
    // DeadlineExpiredInQueueNeverRuns was counted CANCELLED).
    constexpr auto kDeadlineSlack = std::chrono::milliseconds(100);
    const gpr_timespec d = ctx_->raw_deadline();
    const bool expired = gpr_time_cmp(d, gpr_inf_future(d.clock_type)) != 0 &&
                         ctx_->deadline() <= std::chrono::system_clock::now() + kDeadlineSlack;
    token_->cancel(expired ? api::Code::deadline_exceeded : api::Code::cancelled);
  }
  void OnDone() override { delete this; }

  /// On an executor thread: converts, infers (blocking), fills the response, Finishes.
  void run();

 private:
  Service& service_;
  grpc::CallbackServerContext* ctx_;
  const pb::ModelInferRequest* in_;
  pb::ModelInferResponse* out_;
  const std::shared_ptr<api::CancelToken> token_ = std::make_shared<api::CancelToken>();
};

/// GRPCInferenceService on gRPC's callback API. Quick handlers answer on gRPC's callback
/// thread; those that may block (ModelInfer, model load/unload, CUDA shared-memory register:
/// the first CUDA call creates a context) run on the bounded executor.
class Service final : public pb::GRPCInferenceService::CallbackService {
 public:
  Service(api::InferenceService& core, shm::Registry& registry, int max_threads,
          const security::AccessPolicy* access)
      : core_(core), registry_(registry), access_(access), executor_(max_threads) {}

  api::InferenceService& core() { return core_; }
  shm::Registry& registry() { return registry_; }
  DeadlineTimer& timer() { return timer_; }
  /// Waits for the executor's tasks (after grpc::Server::Shutdown) and joins its threads.
  void stop() { executor_.stop(); }

  /// RESOURCE_EXHAUSTED for a call refused by the executor.
  grpc::Status busy() const {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "server busy: " + std::to_string(executor_.max_threads()) +
                            " calls in progress (server.max_concurrent_rpcs)");
  }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* out) override {
    return inline_call(ctx, security::ApiGroup::health, "ServerLive",
                       [=] { out->set_live(core_.live()); });
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* out) override {
    return inline_call(ctx, security::ApiGroup::health, "ServerReady",
                       [=] { out->set_ready(core_.ready()); });
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const pb::ModelReadyRequest* in,
                                       pb::ModelReadyResponse* out) override {
    return inline_call(ctx, security::ApiGroup::health, "ModelReady",
                       [=] { out->set_ready(core_.model_ready(in->name(), in->version())); });
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* out) override {
    return inline_call(ctx, security::ApiGroup::metadata, "ServerMetadata", [=] {
      const auto m = core_.server_metadata();
      out->set_name(m.name);
      out->set_version(m.version);
      for (const auto& e : m.extensions) out->add_extensions(e);
      // The transport serves these (Triton's extension names).
      out->add_extensions("system_shared_memory");
      if (shm::Registry::cuda_built()) out->add_extensions("cuda_shared_memory");
    });
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const pb::ModelMetadataRequest* in,
                                          pb::ModelMetadataResponse* out) override {
    return inline_call(ctx, security::ApiGroup::metadata, "ModelMetadata", [=] {
      const auto m = core_.model_metadata(in->name(), in->version());
      out->set_name(m.name);
      for (const auto& v : m.versions) out->add_versions(v);
      out->set_platform(m.platform);
      for (const auto& t : m.inputs) fill_tensor(t, out->add_inputs());
      for (const auto& t : m.outputs) fill_tensor(t, out->add_outputs());
    });
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const pb::ModelConfigRequest* in,
                                        pb::ModelConfigResponse* out) override {
    return inline_call(ctx, security::ApiGroup::model_config, "ModelConfig", [=] {
      const auto c = core_.model_config(in->name(), in->version());
      auto* cfg = out->mutable_config();
      cfg->set_name(c.name);
      cfg->set_platform(c.platform);
      cfg->set_backend(c.backend);
      cfg->set_max_batch_size(c.max_batch_size);
      for (const auto& t : c.inputs) {
        auto* i = cfg->add_input();
        i->set_name(t.name);
        i->set_data_type(to_pb_type(t.datatype));
        i->set_optional(t.optional);
        for (auto d : t.shape) i->add_dims(d);
      }
      for (const auto& t : c.outputs) {
        auto* o = cfg->add_output();
        o->set_name(t.name);
        o->set_data_type(to_pb_type(t.datatype));
        for (auto d : t.shape) o->add_dims(d);
      }
      for (const auto& g : c.instance_group) {
        auto* ig = cfg->add_instance_group();
        ig->set_name(g.name);
        ig->set_count(g.count);
        ig->set_kind(g.kind == "KIND_GPU" ? pb::ModelInstanceGroup::KIND_GPU
                                          : pb::ModelInstanceGroup::KIND_CPU);
        for (auto i : g.gpus) ig->add_gpus(i);
      }
      auto* db = cfg->mutable_dynamic_batching();
      db->set_max_queue_delay_microseconds(c.max_queue_delay_microseconds);
      db->mutable_default_queue_policy()->set_max_queue_size(c.max_queue_size);
      db->mutable_default_queue_policy()->set_default_timeout_microseconds(
          c.default_timeout_microseconds);
      for (const auto& [k, v] : c.parameters) (*cfg->mutable_parameters())[k].set_string_value(v);
    });
  }
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const pb::ModelStatisticsRequest* in,
                                            pb::ModelStatisticsResponse* out) override {
    return inline_call(ctx, security::ApiGroup::statistics, "ModelStatistics", [=] {
      for (const auto& s : core_.model_statistics(in->name(), in->version())) {
        auto* m = out->add_model_stats();
        m->set_name(s.name);
        m->set_version(s.version);
        m->set_last_inference(s.last_inference_ms);
        m->set_inference_count(s.inference_count);
        m->set_execution_count(s.execution_count);
        auto* st = m->mutable_inference_stats();
        fill_duration(s.success, st->mutable_success());
        fill_duration(s.fail, st->mutable_fail());
        fill_duration(s.queue, st->mutable_queue());
        fill_duration(s.compute_input, st->mutable_compute_input());
        fill_duration(s.compute_infer, st->mutable_compute_infer());
        fill_duration(s.compute_output, st->mutable_compute_output());
        for (const auto& b : s.batch_stats) {
          auto* bs = m->add_batch_stats();
          bs->set_batch_size(b.batch_size);
          fill_duration(b.compute_input, bs->mutable_compute_input());
          fill_duration(b.compute_infer, bs->mutable_compute_infer());
          fill_duration(b.compute_output, bs->mutable_compute_output());
        }
      }
    });
  }
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const pb::RepositoryIndexRequest* in,
                                            pb::RepositoryIndexResponse* out) override {
    return inline_call(ctx, security::ApiGroup::model_repository, "RepositoryIndex", [=] {
      for (const auto& e : core_.repository_index(in->ready())) {
        auto* m = out->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(e.state);
        m->set_reason(e.reason);
      }
    });
  }
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const pb::RepositoryModelLoadRequest* in,
                                                pb::RepositoryModelLoadResponse*) override {
    return offloaded(ctx, security::ApiGroup::model_repository, "RepositoryModelLoad",
                     [=] { core_.load_model(in->model_name()); });
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const pb::RepositoryModelUnloadRequest* in,
                                                  pb::RepositoryModelUnloadResponse*) override {
    return offloaded(ctx, security::ApiGroup::model_repository, "RepositoryModelUnload",
                     [=] { core_.unload_model(in->model_name()); });
  }

  // --- shared memory (server/shm/registry.h; Triton's messages) ---------------------------
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryStatusRequest* in,
      pb::SystemSharedMemoryStatusResponse* out) override {
    return inline_call(ctx, security::ApiGroup::shared_memory, "SystemSharedMemoryStatus", [=] {
      for (const auto& r : registry_.system_status(in->name())) {
        auto& s = (*out->mutable_regions())[r.name];
        s.set_name(r.name);
        s.set_key(r.key);
        s.set_offset(r.offset);
        s.set_byte_size(r.byte_size);
      }
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryRegisterRequest* in,
      pb::SystemSharedMemoryRegisterResponse*) override {
    return inline_call(ctx, security::ApiGroup::shared_memory, "SystemSharedMemoryRegister", [=] {
      registry_.register_system(in->name(), in->key(), in->offset(), in->byte_size());
      log::info("system shared memory region '" + in->name() + "' registered (key '" + in->key() +
                "', offset " + std::to_string(in->offset()) + ", " +
                std::to_string(in->byte_size()) + " bytes)");
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryUnregisterRequest* in,
      pb::SystemSharedMemoryUnregisterResponse*) override {
    return inline_call(ctx, security::ApiGroup::shared_memory, "SystemSharedMemoryUnregister",
                       [=] { registry_.unregister_system(in->name()); });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryStatusRequest* in,
      pb::CudaSharedMemoryStatusResponse* out) override {
    return inline_call(ctx, security::ApiGroup::shared_memory, "CudaSharedMemoryStatus", [=] {
      for (const auto& r : registry_.cuda_status(in->name())) {
        auto& s = (*out->mutable_regions())[r.name];
        s.set_name(r.name);
        s.set_device_id(r.device_id);
        s.set_byte_size(r.byte_size);
      }
    });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryRegisterRequest* in,
      pb::CudaSharedMemoryRegisterResponse*) override {
    return offloaded(ctx, security::ApiGroup::shared_memory, "CudaSharedMemoryRegister", [=] {
      registry_.register_cuda(in->name(), in->raw_handle(), in->device_id(), in->byte_size());
      log::info("CUDA shared memory region '" + in->name() + "' registered (device " +
                std::to_string(in->device_id()) + ", " + std::to_string(in->byte_size()) +
                " bytes)");
    });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryUnregisterRequest* in,
      pb::CudaSharedMemoryUnregisterResponse*) override {
    return offloaded(ctx, security::ApiGroup::shared_memory, "CudaSharedMemoryUnregister",
                     [=] { registry_.unregister_cuda(in->name()); });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const pb::ModelInferRequest* in,
                                       pb::ModelInferResponse* out) override {
    auto* call = new InferCall(*this, ctx, in, out);
    if (auto denied = permitted(ctx, security::ApiGroup::inference); !denied.ok()) {
      call->Finish(denied);
    } else if (!executor_.try_submit([call] { call->run(); })) {
      call->Finish(busy());
    }
    return call;
  }

 private:
  /// PERMISSION_DENIED when server.restricted_apis keeps this caller out of `group`, else OK.
  grpc::Status permitted(grpc::CallbackServerContext* ctx, security::ApiGroup group) const {
    if (!access_) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    const std::string why = access_->check(
        group, security::Protocol::grpc,
        [&md](const std::string& name) -> std::optional<std::string> {
          const auto it = md.find(name);
          if (it == md.end()) return std::nullopt;
          return std::string(it->second.data(), it->second.size());
        },
        security::is_loopback_peer(ctx->peer()));
    if (why.empty()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
  }

  template <class F>
  grpc::ServerUnaryReactor* inline_call(grpc::CallbackServerContext* ctx, security::ApiGroup group,
                                        const char* rpc, F&& body) {
    auto* reactor = ctx->DefaultReactor();
    if (auto denied = permitted(ctx, group); !denied.ok()) {
      reactor->Finish(denied);
      return reactor;
    }
    reactor->Finish(guarded(rpc, std::forward<F>(body)));
    return reactor;
  }

  template <class F>
  grpc::ServerUnaryReactor* offloaded(grpc::CallbackServerContext* ctx, security::ApiGroup group,
                                      const char* rpc, F body) {
    auto* reactor = ctx->DefaultReactor();
    if (auto denied = permitted(ctx, group); !denied.ok()) {
      reactor->Finish(denied);
      return reactor;
    }
    if (!executor_.try_submit(
            [reactor, rpc, body = std::move(body)] { reactor->Finish(guarded(rpc, body)); })) {
      reactor->Finish(busy());
    }
    return reactor;
  }

  api::InferenceService& core_;
  shm::Registry& registry_;
  const security::AccessPolicy* access_;
  DeadlineTimer timer_;
  Executor executor_;  // last: stopped (joined) first, while the rest still exists
};

void InferCall::run() {
  CallRegions regions;  // released after Finish was called: the core is done with them
  std::optional<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>> timer;
  const grpc::Status status = guarded("ModelInfer", [&] {
    api::InferRequest request = to_api(*in_, *ctx_, service_.registry(), regions);
    request.cancel = token_;
    if (request.deadline) {
      timer.emplace(*request.deadline, service_.timer().add(*request.deadline, token_));
    }
    auto response = service_.core().infer(std::move(request));
    fill_response(response, regions, out_);
  });
  if (timer) service_.timer().remove(timer->first, timer->second);
  Finish(status);  // gRPC may delete this from here on: touch no member below
}

/// The port of "host:port" / "[v6]:port"; 0 when it is 0 or not a number (gRPC then fails or
/// picks one, and the bound port is not compared).
int requested_port(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return 0;
  int port = 0;
  for (std::size_t i = colon + 1; i < address.size(); ++i) {
    const char c = address[i];
    if (c < '0' || c > '9' || port > 65535) return 0;
    port = port * 10 + (c - '0');
  }
  return port <= 65535 ? port : 0;
}

}  // namespace

namespace {

/// Plain text, or TLS from `tls`'s files (checked here first: gRPC's provider reads them on its
/// own thread and would only fail the handshakes). `provider` keeps the watcher alive.
std::shared_ptr<grpc::ServerCredentials> credentials(
    const security::TlsFiles& tls,
    std::shared_ptr<grpc::experimental::CertificateProviderInterface>& provider) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  security::TlsContext check(tls);  // throws "TLS: ..." naming the file
  provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file, security::kTlsRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.mutual()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace

struct GrpcServer::Impl {
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> certificates;
  std::unique_ptr<shm::Registry> own_registry;  ///< when GrpcOptions::shm_registry is null
  std::unique_ptr<Service> service;
  std::unique_ptr<HealthService> health;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool stopped = false;
};

GrpcServer::GrpcServer(api::InferenceService& service, const GrpcOptions& options)
    : impl_(std::make_unique<Impl>()) {
  shm::Registry* registry = options.shm_registry;
  if (!registry) {
    impl_->own_registry = std::make_unique<shm::Registry>();
    registry = impl_->own_registry.get();
  }
  impl_->service = std::make_unique<Service>(service, *registry, std::max(options.max_threads, 2),
                                             options.access);
  impl_->health = std::make_unique<HealthService>(
      static_cast<std::size_t>(std::max(options.max_health_watches, 1)));
  grpc::EnableDefaultHealthCheckService(false);  // ours: its Watch streams end at shutdown
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default on Linux: a second daemon on the same address then binds
  // too and the kernel splits new connections between the two. Off, the second one's bind fails
  // (EADDRINUSE) like the HTTP admin port's.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that has not finished its HTTP/2 handshake within 10 s is closed (gRPC's
  // default is 120 s): idle connections cost a descriptor each, and one failed accept() for
  // want of descriptors stops gRPC 1.51's listener for good (server/main.cpp
  // raise_open_files_limit).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  builder.AddListeningPort(options.address, credentials(options.tls, impl_->certificates),
                           &impl_->port);
  builder.RegisterService(impl_->service.get());
  builder.RegisterService(impl_->health.get());
  const int limit = static_cast<int>(
      std::min<std::size_t>(options.max_message_bytes, static_cast<std::size_t>(INT32_MAX)));
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  impl_->server = builder.BuildAndStart();
  // A name resolving to several addresses (localhost: ::1 and 127.0.0.1) starts when at least
  // one binds: a port other than the one asked for means the asked one was not bound.
  const int wanted = requested_port(options.address);
  if (!impl_->server || impl_->port == 0 || (wanted > 0 && impl_->port != wanted)) {
    if (impl_->server) impl_->server->Shutdown();
    throw std::runtime_error("gRPC: cannot listen on " + options.address +
                             " (the port is in use, e.g. by another daemon, or the address is "
                             "not local)");
  }
  impl_->health->set("liveness", true);
  set_ready(false);
  log::info("gRPC listening on " + options.address + " (port " + std::to_string(impl_->port) +
            (options.tls.enabled() ? (options.tls.mutual() ? "; mutual TLS" : "; TLS") : "") + ")");
}

GrpcServer::~GrpcServer() { shutdown(0.0); }

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::set_ready(bool ready) {
  impl_->health->set("", ready);
  impl_->health->set("readiness", ready);
}

void GrpcServer::shutdown(double grace_seconds) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(grace_seconds * 1000));
  // Health Watch streams never end on their own: finished first, they do not hold the grace.
  // In-flight calls get until `deadline`, then gRPC cancels them (OnCancel: a request still
  // queued is answered at once).
  impl_->health->shutdown();
  impl_->server->Shutdown(deadline);
  impl_->server->Wait();
  impl_->service->stop();
}

}  // namespace libreyolo::server::rpc
