// GRPCInferenceService implementation: protobuf <-> api types, status mapping; the health service
// is health_service.h. Every unary method takes its request as bytes and parses it here (an
// unparseable one is INVALID_ARGUMENT), and the stop refuses new calls UNAVAILABLE before gRPC's
// Shutdown.
// This translation unit sees gRPC and Debian's protobuf, never torch.
#include "server/grpc/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <atomic>
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
#include "server/grpc/log_limiter.h"
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
    // The task's own output parameters (prompted detection: truncated_labels, truncated_task
    // on `labels`).
    for (const auto& [key, value] : t.parameters) {
      auto& p = (*o->mutable_parameters())[key];
      if (const auto* text = std::get_if<std::string>(&value)) p.set_string_param(*text);
      if (const auto* i = std::get_if<std::int64_t>(&value)) p.set_int64_param(*i);
      if (const auto* b = std::get_if<bool>(&value)) p.set_bool_param(*b);
    }
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
  InferCall(Service& service, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
            grpc::ByteBuffer* response)
      : service_(service), ctx_(ctx), request_(request), response_(response) {}

  void OnCancel() override {
    // gRPC cancels a call whose deadline passed as well: that one is DEADLINE_EXCEEDED. The
    // client's own deadline resets the stream up to the request's transit time before the
    // server's deadline (computed from grpc-timeout on arrival), and HTTP/2 carries no reason,
    // so a cancel in the last half of the call's window (at least kDeadlineSlack) counts as the
    // deadline: transit under load reached 100 ms (ServerGrpc.DeadlineExpiredInQueueNeverRuns
    // was counted CANCELLED on a loaded 2-core CI machine).
    constexpr auto kDeadlineSlack = std::chrono::milliseconds(100);
    const gpr_timespec d = ctx_->raw_deadline();
    bool expired = false;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) != 0) {
      const auto deadline = ctx_->deadline();
      const auto slack =
          std::max<std::chrono::system_clock::duration>(kDeadlineSlack, (deadline - arrived_) / 2);
      expired = deadline <= std::chrono::system_clock::now() + slack;
    }
    token_->cancel(expired ? api::Code::deadline_exceeded : api::Code::cancelled);
  }
  void OnDone() override { delete this; }

  /// On an executor thread: parses, converts, infers (blocking), serializes the response,
  /// Finishes.
  void run();

 private:
  Service& service_;
  grpc::CallbackServerContext* ctx_;
  const grpc::ByteBuffer* request_;  ///< the request's bytes, freed once parsed
  grpc::ByteBuffer* response_;
  const std::shared_ptr<api::CancelToken> token_ = std::make_shared<api::CancelToken>();
  /// When gRPC handed the call over: the deadline window's start, for OnCancel's slack.
  const std::chrono::system_clock::time_point arrived_ = std::chrono::system_clock::now();
};

using gis = pb::GRPCInferenceService;

/// Every unary method raw: gRPC hands the request's bytes (grpc::ByteBuffer) and takes the
/// response's, and Service parses and serializes them itself. The generated typed handlers answer
/// a request that does not parse UNIMPLEMENTED with no message (CallbackUnaryHandler::RunHandler
/// in grpcpp/impl/codegen/server_callback_handlers.h), which names neither the problem nor the
/// method. ModelStreamInfer stays the generated callback method (UNIMPLEMENTED: not served).
using RawService = gis::WithRawCallbackMethod_ServerLive<gis::WithRawCallbackMethod_ServerReady<
    gis::WithRawCallbackMethod_ModelReady<gis::WithRawCallbackMethod_ServerMetadata<
        gis::WithRawCallbackMethod_ModelMetadata<gis::WithRawCallbackMethod_ModelInfer<
            gis::WithCallbackMethod_ModelStreamInfer<gis::WithRawCallbackMethod_ModelConfig<
                gis::WithRawCallbackMethod_ModelStatistics<gis::WithRawCallbackMethod_RepositoryIndex<
                    gis::WithRawCallbackMethod_RepositoryModelLoad<
                        gis::WithRawCallbackMethod_RepositoryModelUnload<
                            gis::WithRawCallbackMethod_SystemSharedMemoryStatus<
                                gis::WithRawCallbackMethod_SystemSharedMemoryRegister<
                                    gis::WithRawCallbackMethod_SystemSharedMemoryUnregister<
                                        gis::WithRawCallbackMethod_CudaSharedMemoryStatus<
                                            gis::WithRawCallbackMethod_CudaSharedMemoryRegister<
                                                gis::
                                                    WithRawCallbackMethod_CudaSharedMemoryUnregister<
                                                        gis::Service>>>>>>>>>>>>>>>>>>;

/// GRPCInferenceService on gRPC's callback API. Quick handlers answer on gRPC's callback
/// thread; those that may block (ModelInfer, model load/unload, CUDA shared-memory register:
/// the first CUDA call creates a context) run on the bounded executor.
class Service final : public RawService {
 public:
  Service(api::InferenceService& core, shm::Registry& registry, int max_threads,
          const security::AccessPolicy* access)
      : core_(core), registry_(registry), access_(access), executor_(max_threads) {}

  api::InferenceService& core() { return core_; }
  shm::Registry& registry() { return registry_; }
  DeadlineTimer& timer() { return timer_; }
  /// Waits for the executor's tasks (after grpc::Server::Shutdown) and joins its threads.
  void stop() { executor_.stop(); }

  /// From now on every new call is answered shutting_down() (the stop, before gRPC's Shutdown).
  void refuse() { refusing_.store(true); }
  /// Waits until no call runs on the executor, or until `deadline`; true when none runs.
  bool wait_idle(std::chrono::steady_clock::time_point deadline) {
    return executor_.wait_idle(deadline);
  }
  /// Calls still running on the executor.
  int in_flight() { return executor_.busy(); }

  /// UNAVAILABLE for a call that arrives after refuse(): the client may retry elsewhere.
  static grpc::Status shutting_down() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }

  /// Parses `request` (a `rpc` call's bytes) into `msg`, then frees the bytes as gRPC's typed
  /// handlers do (GenericDeserialize in grpcpp/impl/codegen/proto_utils.h clears the buffer): a
  /// large tensor is held once, as the parsed message, while the call runs. The bytes are read
  /// in place through grpc::ProtoBufferReader, never copied into one block. INVALID_ARGUMENT
  /// "<rpc>: the request is not a valid <type> (protobuf parse failed, N bytes)" when they do not
  /// parse, logged at most once per second (LogLimiter).
  template <class M>
  grpc::Status parse(grpc::CallbackServerContext* ctx, const char* rpc,
                     const grpc::ByteBuffer& request, M& msg) {
    // gRPC owns the buffer until the call ends and only destroys it then; emptied here, it has
    // nothing left to destroy (the object itself is not const: MessageHolder's request).
    auto& bytes = const_cast<grpc::ByteBuffer&>(request);
    std::string problem;
    if (!bytes.Valid()) {
      problem = std::string(rpc) + ": the request carries no " + M::descriptor()->full_name() +
                " message";
    } else {
      const std::size_t size = bytes.Length();
      bool parsed = false;
      {
        grpc::ProtoBufferReader reader(&bytes);
        parsed = reader.status().ok() && msg.ParseFromZeroCopyStream(&reader);
      }
      bytes.Clear();
      if (parsed) return grpc::Status::OK;
      problem = std::string(rpc) + ": the request is not a valid " + M::descriptor()->full_name() +
                " (protobuf parse failed, " + std::to_string(size) + " bytes)";
    }
    malformed_log_.write("gRPC " + problem + " (from " + ctx->peer() + ")");
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, problem);
  }

  /// Serializes `msg` into `response` (gRPC's own serializer: one copy, into its slices).
  template <class M>
  static grpc::Status serialize(const char* rpc, const M& msg, grpc::ByteBuffer& response) {
    bool own = false;
    const grpc::Status s = grpc::SerializationTraits<M>::Serialize(msg, &response, &own);
    if (s.ok()) return s;
    log::error(std::string(rpc) + ": the response cannot be serialized: " + s.error_message());
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        std::string(rpc) + ": the response cannot be serialized");
  }

  /// RESOURCE_EXHAUSTED for a call refused by the executor.
  grpc::Status busy() const {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "server busy: " + std::to_string(executor_.max_threads()) +
                            " calls in progress (server.max_concurrent_rpcs)");
  }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    return inline_call<pb::ServerLiveRequest, pb::ServerLiveResponse>(
        ctx, request, response, security::ApiGroup::health, "ServerLive",
        [this](const auto*, auto* out) { out->set_live(core_.live()); });
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override {
    return inline_call<pb::ServerReadyRequest, pb::ServerReadyResponse>(
        ctx, request, response, security::ApiGroup::health, "ServerReady",
        [this](const auto*, auto* out) { out->set_ready(core_.ready()); });
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    return inline_call<pb::ModelReadyRequest, pb::ModelReadyResponse>(
        ctx, request, response, security::ApiGroup::health, "ModelReady",
        [this](const auto* in, auto* out) {
          out->set_ready(core_.model_ready(in->name(), in->version()));
        });
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override {
    return inline_call<pb::ServerMetadataRequest, pb::ServerMetadataResponse>(
        ctx, request, response, security::ApiGroup::metadata, "ServerMetadata",
        [this](const auto*, auto* out) {
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
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override {
    return inline_call<pb::ModelMetadataRequest, pb::ModelMetadataResponse>(
        ctx, request, response, security::ApiGroup::metadata, "ModelMetadata",
        [this](const auto* in, auto* out) {
          const auto m = core_.model_metadata(in->name(), in->version());
          out->set_name(m.name);
          for (const auto& v : m.versions) out->add_versions(v);
          out->set_platform(m.platform);
          for (const auto& t : m.inputs) fill_tensor(t, out->add_inputs());
          for (const auto& t : m.outputs) fill_tensor(t, out->add_outputs());
        });
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override {
    return inline_call<pb::ModelConfigRequest, pb::ModelConfigResponse>(
        ctx, request, response, security::ApiGroup::model_config, "ModelConfig",
        [this](const auto* in, auto* out) {
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
          for (const auto& [k, v] : c.parameters)
            (*cfg->mutable_parameters())[k].set_string_value(v);
        });
  }
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override {
    return inline_call<pb::ModelStatisticsRequest, pb::ModelStatisticsResponse>(
        ctx, request, response, security::ApiGroup::statistics, "ModelStatistics",
        [this](const auto* in, auto* out) {
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
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override {
    return inline_call<pb::RepositoryIndexRequest, pb::RepositoryIndexResponse>(
        ctx, request, response, security::ApiGroup::model_repository, "RepositoryIndex",
        [this](const auto* in, auto* out) {
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
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) override {
    return offloaded<pb::RepositoryModelLoadRequest, pb::RepositoryModelLoadResponse>(
        ctx, request, response, security::ApiGroup::model_repository, "RepositoryModelLoad",
        [this](const auto* in, auto*) { core_.load_model(in->model_name()); });
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) override {
    return offloaded<pb::RepositoryModelUnloadRequest, pb::RepositoryModelUnloadResponse>(
        ctx, request, response, security::ApiGroup::model_repository, "RepositoryModelUnload",
        [this](const auto* in, auto*) { core_.unload_model(in->model_name()); });
  }

  // --- shared memory (server/shm/registry.h; Triton's messages) ---------------------------
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) override {
    return inline_call<pb::SystemSharedMemoryStatusRequest, pb::SystemSharedMemoryStatusResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "SystemSharedMemoryStatus",
        [this](const auto* in, auto* out) {
          for (const auto& r : registry_.system_status(in->name())) {
            auto& s = (*out->mutable_regions())[r.name];
            s.set_name(r.name);
            s.set_key(r.key);
            s.set_offset(r.offset);
            s.set_byte_size(r.byte_size);
          }
        });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) override {
    return inline_call<pb::SystemSharedMemoryRegisterRequest,
                       pb::SystemSharedMemoryRegisterResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "SystemSharedMemoryRegister",
        [this](const auto* in, auto*) {
          registry_.register_system(in->name(), in->key(), in->offset(), in->byte_size());
          log::info("system shared memory region '" + in->name() + "' registered (key '" +
                    in->key() + "', offset " + std::to_string(in->offset()) + ", " +
                    std::to_string(in->byte_size()) + " bytes)");
        });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) override {
    return inline_call<pb::SystemSharedMemoryUnregisterRequest,
                       pb::SystemSharedMemoryUnregisterResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "SystemSharedMemoryUnregister",
        [this](const auto* in, auto*) { registry_.unregister_system(in->name()); });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) override {
    return inline_call<pb::CudaSharedMemoryStatusRequest, pb::CudaSharedMemoryStatusResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "CudaSharedMemoryStatus",
        [this](const auto* in, auto* out) {
          for (const auto& r : registry_.cuda_status(in->name())) {
            auto& s = (*out->mutable_regions())[r.name];
            s.set_name(r.name);
            s.set_device_id(r.device_id);
            s.set_byte_size(r.byte_size);
          }
        });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) override {
    return offloaded<pb::CudaSharedMemoryRegisterRequest, pb::CudaSharedMemoryRegisterResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "CudaSharedMemoryRegister",
        [this](const auto* in, auto*) {
          registry_.register_cuda(in->name(), in->raw_handle(), in->device_id(), in->byte_size());
          log::info("CUDA shared memory region '" + in->name() + "' registered (device " +
                    std::to_string(in->device_id()) + ", " + std::to_string(in->byte_size()) +
                    " bytes)");
        });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) override {
    return offloaded<pb::CudaSharedMemoryUnregisterRequest, pb::CudaSharedMemoryUnregisterResponse>(
        ctx, request, response, security::ApiGroup::shared_memory, "CudaSharedMemoryUnregister",
        [this](const auto* in, auto*) { registry_.unregister_cuda(in->name()); });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    auto* call = new InferCall(*this, ctx, request, response);
    if (auto refused = admit(ctx, security::ApiGroup::inference); !refused.ok()) {
      call->Finish(refused);
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

  /// shutting_down() after refuse(), else permitted().
  grpc::Status admit(grpc::CallbackServerContext* ctx, security::ApiGroup group) const {
    if (refusing_.load()) return shutting_down();
    return permitted(ctx, group);
  }

  /// Parses the request, runs `body(const Req*, Resp*)`, serializes the response: the call's
  /// status.
  template <class Req, class Resp, class F>
  grpc::Status answer(grpc::CallbackServerContext* ctx, const char* rpc,
                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response, F& body) {
    Req in;
    if (auto bad = parse(ctx, rpc, *request, in); !bad.ok()) return bad;
    Resp out;
    if (auto failed = guarded(rpc, [&] { body(&in, &out); }); !failed.ok()) return failed;
    return serialize(rpc, out, *response);
  }

  /// A quick call, answered on gRPC's callback thread.
  template <class Req, class Resp, class F>
  grpc::ServerUnaryReactor* inline_call(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                        security::ApiGroup group, const char* rpc, F body) {
    auto* reactor = ctx->DefaultReactor();
    if (auto refused = admit(ctx, group); !refused.ok()) {
      reactor->Finish(refused);
      return reactor;
    }
    reactor->Finish(answer<Req, Resp>(ctx, rpc, request, response, body));
    return reactor;
  }

  /// A call that may block, parsed and run on the executor.
  template <class Req, class Resp, class F>
  grpc::ServerUnaryReactor* offloaded(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                      security::ApiGroup group, const char* rpc, F body) {
    auto* reactor = ctx->DefaultReactor();
    if (auto refused = admit(ctx, group); !refused.ok()) {
      reactor->Finish(refused);
      return reactor;
    }
    if (!executor_.try_submit(
            [this, ctx, reactor, request, response, rpc, body = std::move(body)]() mutable {
              reactor->Finish(answer<Req, Resp>(ctx, rpc, request, response, body));
            })) {
      reactor->Finish(busy());
    }
    return reactor;
  }

  api::InferenceService& core_;
  shm::Registry& registry_;
  const security::AccessPolicy* access_;
  std::atomic<bool> refusing_{false};
  LogLimiter malformed_log_{log::Level::warn};
  DeadlineTimer timer_;
  Executor executor_;  // last: stopped (joined) first, while the rest still exists
};

void InferCall::run() {
  // Both released after Finish was called: the core is done with the tensors they hold (the
  // inputs are views into `in`'s raw_input_contents or into the regions).
  CallRegions regions;
  pb::ModelInferRequest in;
  std::optional<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>> timer;
  grpc::Status status = service_.parse(ctx_, "ModelInfer", *request_, in);
  if (status.ok()) {
    pb::ModelInferResponse out;
    status = guarded("ModelInfer", [&] {
      api::InferRequest request = to_api(in, *ctx_, service_.registry(), regions);
      request.cancel = token_;
      if (request.deadline) {
        timer.emplace(*request.deadline, service_.timer().add(*request.deadline, token_));
      }
      auto response = service_.core().infer(std::move(request));
      fill_response(response, regions, &out);
    });
    if (timer) service_.timer().remove(timer->first, timer->second);
    if (status.ok()) status = Service::serialize("ModelInfer", out, *response_);
  }
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
  const auto grace =
      std::chrono::milliseconds(static_cast<long>(std::max(grace_seconds, 0.0) * 1000));
  const auto deadline = std::chrono::steady_clock::now() + grace;
  // gRPC's Shutdown kills every call that reaches its core afterwards, and the client reads
  // CANCELLED (Server::CallData::StartNewRpc -> KillZombie in src/core/lib/surface/server.cc).
  // So first the service answers new calls UNAVAILABLE itself, on a server still listening,
  // until the calls in flight are done or the grace is over; only then does gRPC shut down
  // (a call on the wire while its GOAWAY travels to the client is still CANCELLED: no API
  // sends the GOAWAY alone).
  impl_->service->refuse();
  const int in_flight = impl_->service->in_flight();
  log::info("gRPC: refusing new calls (UNAVAILABLE: the server is shutting down); " +
            std::to_string(in_flight) + " in flight");
  if (!impl_->service->wait_idle(deadline)) {
    log::warn("gRPC: " + std::to_string(impl_->service->in_flight()) +
              " calls still in flight after the grace period are cancelled");
  }
  // Health Watch streams never end on their own: finished first, they do not hold the stop.
  impl_->health->shutdown();
  // Calls still in flight (past the grace) are cancelled at the deadline (OnCancel: a request
  // still queued is answered at once); it is at least kRefusalWrite away so that the refusals
  // just answered are written out, not cancelled.
  constexpr auto kRefusalWrite = std::chrono::seconds(1);
  const auto left = std::max<std::chrono::steady_clock::duration>(
      deadline - std::chrono::steady_clock::now(), kRefusalWrite);
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  impl_->server->Wait();
  impl_->service->stop();
}

}  // namespace libreyolo::server::rpc
