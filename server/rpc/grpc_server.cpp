// GRPCInferenceService implementation: protobuf <-> api types, status mapping, health service.
// This translation unit sees gRPC and Debian's protobuf, never torch.
#include "server/rpc/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <cstring>
#include <sstream>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "log/log.h"
#include "server/rpc/infer_request.h"

namespace libreyolo::server::rpc {
namespace {

namespace pb = ::inference;

/// Longest status message sent, bytes. The message travels in the grpc-message trailer and
/// clients refuse metadata above 8 KiB (grpc.max_metadata_size): a longer one reached the client
/// as RESOURCE_EXHAUSTED "received metadata size exceeds limit" instead of the real status. The
/// core clips the names it echoes (server/core/model_name.h quoted_name); this is the net for
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

api::InferRequest to_api(const pb::ModelInferRequest& r, const grpc::ServerContext& ctx) {
  api::InferRequest out = to_infer_request(r);
  out.cancelled = [&ctx] { return ctx.IsCancelled(); };
  const gpr_timespec raw_deadline = ctx.raw_deadline();
  if (gpr_time_cmp(raw_deadline, gpr_inf_future(raw_deadline.clock_type)) != 0) {
    const auto left = ctx.deadline() - std::chrono::system_clock::now();
    out.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  }
  return out;
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

class Service final : public pb::GRPCInferenceService::Service {
 public:
  explicit Service(api::InferenceService& core) : core_(core) {}

  grpc::Status ServerLive(grpc::ServerContext*, const pb::ServerLiveRequest*,
                          pb::ServerLiveResponse* out) override {
    return guarded("ServerLive", [&] { out->set_live(core_.live()); });
  }
  grpc::Status ServerReady(grpc::ServerContext*, const pb::ServerReadyRequest*,
                           pb::ServerReadyResponse* out) override {
    return guarded("ServerReady", [&] { out->set_ready(core_.ready()); });
  }
  grpc::Status ModelReady(grpc::ServerContext*, const pb::ModelReadyRequest* in,
                          pb::ModelReadyResponse* out) override {
    return guarded("ModelReady",
                   [&] { out->set_ready(core_.model_ready(in->name(), in->version())); });
  }
  grpc::Status ServerMetadata(grpc::ServerContext*, const pb::ServerMetadataRequest*,
                              pb::ServerMetadataResponse* out) override {
    return guarded("ServerMetadata", [&] {
      const auto m = core_.server_metadata();
      out->set_name(m.name);
      out->set_version(m.version);
      for (const auto& e : m.extensions) out->add_extensions(e);
    });
  }
  grpc::Status ModelMetadata(grpc::ServerContext*, const pb::ModelMetadataRequest* in,
                             pb::ModelMetadataResponse* out) override {
    return guarded("ModelMetadata", [&] {
      const auto m = core_.model_metadata(in->name(), in->version());
      out->set_name(m.name);
      for (const auto& v : m.versions) out->add_versions(v);
      out->set_platform(m.platform);
      for (const auto& t : m.inputs) fill_tensor(t, out->add_inputs());
      for (const auto& t : m.outputs) fill_tensor(t, out->add_outputs());
    });
  }
  grpc::Status ModelConfig(grpc::ServerContext*, const pb::ModelConfigRequest* in,
                           pb::ModelConfigResponse* out) override {
    return guarded("ModelConfig", [&] {
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
      auto* db = cfg->mutable_dynamic_batching();
      db->set_max_queue_delay_microseconds(c.max_queue_delay_microseconds);
      db->mutable_default_queue_policy()->set_max_queue_size(c.max_queue_size);
      db->mutable_default_queue_policy()->set_default_timeout_microseconds(
          c.default_timeout_microseconds);
      for (const auto& [k, v] : c.parameters) (*cfg->mutable_parameters())[k].set_string_value(v);
    });
  }
  grpc::Status ModelStatistics(grpc::ServerContext*, const pb::ModelStatisticsRequest* in,
                               pb::ModelStatisticsResponse* out) override {
    return guarded("ModelStatistics", [&] {
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
  grpc::Status RepositoryIndex(grpc::ServerContext*, const pb::RepositoryIndexRequest* in,
                               pb::RepositoryIndexResponse* out) override {
    return guarded("RepositoryIndex", [&] {
      for (const auto& e : core_.repository_index(in->ready())) {
        auto* m = out->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(e.state);
        m->set_reason(e.reason);
      }
    });
  }
  grpc::Status RepositoryModelLoad(grpc::ServerContext*, const pb::RepositoryModelLoadRequest* in,
                                   pb::RepositoryModelLoadResponse*) override {
    return guarded("RepositoryModelLoad", [&] { core_.load_model(in->model_name()); });
  }
  grpc::Status RepositoryModelUnload(grpc::ServerContext*,
                                     const pb::RepositoryModelUnloadRequest* in,
                                     pb::RepositoryModelUnloadResponse*) override {
    return guarded("RepositoryModelUnload", [&] { core_.unload_model(in->model_name()); });
  }
  grpc::Status ModelInfer(grpc::ServerContext* ctx, const pb::ModelInferRequest* in,
                          pb::ModelInferResponse* out) override {
    return guarded("ModelInfer", [&] {
      auto response = core_.infer(to_api(*in, *ctx));
      out->set_model_name(response.model_name);
      out->set_model_version(response.model_version);
      out->set_id(response.id);
      for (auto& t : response.outputs) {
        auto* o = out->add_outputs();
        o->set_name(t.name);
        o->set_datatype(t.datatype);
        for (auto d : t.shape) o->add_shape(d);
        out->add_raw_output_contents(std::move(t.data));
      }
    });
  }

 private:
  api::InferenceService& core_;
};

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

struct GrpcServer::Impl {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool stopped = false;
};

GrpcServer::GrpcServer(api::InferenceService& service, const GrpcOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->service = std::make_unique<Service>(service);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default on Linux: a second daemon on the same address then binds
  // too and the kernel splits new connections between the two. Off, the second one's bind fails
  // (EADDRINUSE) like the HTTP admin port's.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &impl_->port);
  builder.RegisterService(impl_->service.get());
  const int limit = static_cast<int>(
      std::min<std::size_t>(options.max_message_bytes, static_cast<std::size_t>(INT32_MAX)));
  grpc::ResourceQuota quota("libreyolo-grpc");
  quota.SetMaxThreads(std::max(options.max_threads, 2));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  // Sync threads wake at least this often; Wait() after Shutdown() takes up to this long.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 200);
  if (options.threads > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                options.threads);
  }
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
  auto* health = impl_->server->GetHealthCheckService();
  health->SetServingStatus("liveness", true);
  set_ready(false);
  log::info("gRPC listening on " + options.address + " (port " + std::to_string(impl_->port) + ")");
}

GrpcServer::~GrpcServer() { shutdown(0.0); }

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::set_ready(bool ready) {
  auto* health = impl_->server->GetHealthCheckService();
  health->SetServingStatus("", ready);
  health->SetServingStatus("readiness", ready);
}

void GrpcServer::shutdown(double grace_seconds) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<long>(grace_seconds * 1000));
  impl_->server->Shutdown(deadline);
  impl_->server->Wait();
}

}  // namespace libreyolo::server::rpc
