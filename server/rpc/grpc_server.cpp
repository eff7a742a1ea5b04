// GRPCInferenceService implementation: protobuf <-> api types, status mapping, health service.
// This translation unit sees gRPC and Debian's protobuf, never torch.
#include "server/rpc/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

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
#include "server/rpc/infer_request.h"
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

/// A bounded pool for the handlers that block (ModelInfer waits for its batch, a model load
/// reads a checkpoint): gRPC's callback threads only hand work over, so a slow call never
/// holds one of them. At most `max_threads` tasks run at once, threads start on demand and stay;
/// a task beyond that is refused at once (the caller answers RESOURCE_EXHAUSTED) instead of
/// waiting with its request in memory, the bound server.max_concurrent_rpcs sets.
class Executor {
 public:
  explicit Executor(int max_threads) : max_(std::max(max_threads, 1)) {}
  ~Executor() { stop(); }

  /// Runs `task` on a pool thread; false (and `task` not run) when max_threads tasks run.
  bool try_submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || busy_ >= max_) return false;
    ++busy_;
    queue_.push_back(std::move(task));
    if (idle_ == 0) {
      threads_.emplace_back([this] { loop(); });
    } else {
      --idle_;  // the woken thread takes it
    }
    cv_.notify_one();
    return true;
  }

  int max_threads() const { return max_; }

  /// Lets queued and running tasks finish, then joins every thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      task();
      lk.lock();
      --busy_;
      ++idle_;
    }
  }

  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int busy_ = 0;  ///< tasks submitted and not finished
  int idle_ = 0;  ///< threads waiting for a task
  bool stopping_ = false;
};

/// One thread that cancels tokens when their call's deadline passes (DEADLINE_EXCEEDED through
/// api::CancelToken), so a request waiting in a model's queue is answered at its deadline
/// without anyone polling. Entries hold weak pointers: a call that ended needs no removal, but
/// remove() keeps the map small.
class DeadlineTimer {
 public:
  DeadlineTimer() : thread_([this] { loop(); }) {}
  ~DeadlineTimer() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Cancels `token` with Code::deadline_exceeded at `when`; returns an id for remove().
  std::uint64_t add(std::chrono::steady_clock::time_point when,
                    const std::shared_ptr<api::CancelToken>& token) {
    std::lock_guard<std::mutex> lk(mu_);
    const std::uint64_t id = next_id_++;
    entries_.emplace(std::make_pair(when, id), token);
    cv_.notify_all();
    return id;
  }

  void remove(std::chrono::steady_clock::time_point when, std::uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.erase(std::make_pair(when, id));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        cv_.wait(lk);
        continue;
      }
      const auto first = entries_.begin();
      if (std::chrono::steady_clock::now() < first->first.first) {
        cv_.wait_until(lk, first->first.first);
        continue;
      }
      auto token = first->second.lock();
      entries_.erase(first);
      lk.unlock();
      if (token) token->cancel(api::Code::deadline_exceeded);
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>,
           std::weak_ptr<api::CancelToken>>
      entries_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

namespace hpb = ::grpc::health::v1;

/// grpc.health.v1.Health on the callback API, replacing gRPC's default health service: its
/// Watch streams never end on their own, so grpc::Server::Shutdown waited the whole grace
/// period for every idle Watch (30 s SIGTERM -> exit with one Watch open, drain_seconds 0).
/// Here shutdown() finishes every Watch (status OK after a last NOT_SERVING message) before the
/// server shuts down. Check of an unknown service is NOT_FOUND, Watch of one streams
/// SERVICE_UNKNOWN (grpc/health/v1/health.proto; what gRPC's default service answers).
class HealthService final : public hpb::Health::CallbackService {
 public:
  class Watcher;

  HealthService() {
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
  bool shut_down_ = false;
};

/// One Watch: sends the latest status whenever it changes (one write in flight at a time; a
/// change during a write is sent after it, only the newest value). gRPC deletes it in OnDone.
class HealthService::Watcher final : public grpc::ServerWriteReactor<hpb::HealthCheckResponse> {
 public:
  Watcher(HealthService& service, std::string name) : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  /// push(status) when `service` is the one this call watches.
  void push_if(const std::string& service, hpb::HealthCheckResponse::ServingStatus status) {
    if (service == name_) push(status);
  }

  /// Queues `status` for sending; with `finish`, the call ends (OK) after it.
  void push(hpb::HealthCheckResponse::ServingStatus status, bool finish = false) {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    pending_ = status;
    finish_after_ = finish_after_ || finish;
    if (!writing_) write_next();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lk(mu_);
    writing_ = false;
    if (!ok) {
      finish(grpc::Status::CANCELLED);
      return;
    }
    write_next();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lk(mu_);
    finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lk(service_.mu_);
      service_.watchers_.erase(this);
    }
    delete this;
  }

 private:
  // Under mu_.
  void write_next() {
    if (finished_) return;
    if (pending_) {
      if (*pending_ != last_sent_) {
        response_.set_status(*pending_);
        last_sent_ = *pending_;
        pending_.reset();
        writing_ = true;
        StartWrite(&response_);
        return;
      }
      pending_.reset();
    }
    if (finish_after_) finish(grpc::Status::OK);
  }
  void finish(const grpc::Status& status) {
    if (finished_ || writing_) {
      // A write in flight: OnWriteDone finishes (finish_after_, or !ok -> CANCELLED).
      if (!finished_) finish_after_ = true;
      return;
    }
    finished_ = true;
    Finish(status);
  }

  HealthService& service_;
  const std::string name_;
  std::mutex mu_;
  hpb::HealthCheckResponse response_;
  std::optional<hpb::HealthCheckResponse::ServingStatus> pending_;
  int last_sent_ = -1;
  bool writing_ = false, finish_after_ = false, finished_ = false;
};

grpc::ServerWriteReactor<hpb::HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const hpb::HealthCheckRequest* in) {
  auto* w = new Watcher(*this, in->service());
  std::lock_guard<std::mutex> lk(mu_);
  watchers_.insert(w);
  w->push(status_of(in->service()), shut_down_);
  return w;
}

void HealthService::set(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lk(mu_);
  if (shut_down_) return;
  const auto s =
      serving ? hpb::HealthCheckResponse::SERVING : hpb::HealthCheckResponse::NOT_SERVING;
  status_[service] = s;
  // Watchers only ever read their own service's status; the name is fixed at construction.
  for (auto* w : watchers_) w->push_if(service, s);
}

void HealthService::shutdown() {
  std::lock_guard<std::mutex> lk(mu_);
  shut_down_ = true;
  for (auto& [name, s] : status_) s = hpb::HealthCheckResponse::NOT_SERVING;
  for (auto* w : watchers_) w->push(status_of(w->name()), /*finish=*/true);
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
  Service(api::InferenceService& core, shm::Registry& registry, int max_threads)
      : core_(core), registry_(registry), executor_(max_threads) {}

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
    return inline_call(ctx, "ServerLive", [=] { out->set_live(core_.live()); });
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* out) override {
    return inline_call(ctx, "ServerReady", [=] { out->set_ready(core_.ready()); });
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const pb::ModelReadyRequest* in,
                                       pb::ModelReadyResponse* out) override {
    return inline_call(ctx, "ModelReady",
                       [=] { out->set_ready(core_.model_ready(in->name(), in->version())); });
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* out) override {
    return inline_call(ctx, "ServerMetadata", [=] {
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
    return inline_call(ctx, "ModelMetadata", [=] {
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
    return inline_call(ctx, "ModelConfig", [=] {
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
    return inline_call(ctx, "ModelStatistics", [=] {
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
    return inline_call(ctx, "RepositoryIndex", [=] {
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
    return offloaded(ctx, "RepositoryModelLoad", [=] { core_.load_model(in->model_name()); });
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const pb::RepositoryModelUnloadRequest* in,
                                                  pb::RepositoryModelUnloadResponse*) override {
    return offloaded(ctx, "RepositoryModelUnload", [=] { core_.unload_model(in->model_name()); });
  }

  // --- shared memory (server/shm/registry.h; Triton's messages) ---------------------------
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryStatusRequest* in,
      pb::SystemSharedMemoryStatusResponse* out) override {
    return inline_call(ctx, "SystemSharedMemoryStatus", [=] {
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
    return inline_call(ctx, "SystemSharedMemoryRegister", [=] {
      registry_.register_system(in->name(), in->key(), in->offset(), in->byte_size());
      log::info("system shared memory region '" + in->name() + "' registered (key '" + in->key() +
                "', offset " + std::to_string(in->offset()) + ", " +
                std::to_string(in->byte_size()) + " bytes)");
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::SystemSharedMemoryUnregisterRequest* in,
      pb::SystemSharedMemoryUnregisterResponse*) override {
    return inline_call(ctx, "SystemSharedMemoryUnregister",
                       [=] { registry_.unregister_system(in->name()); });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryStatusRequest* in,
      pb::CudaSharedMemoryStatusResponse* out) override {
    return inline_call(ctx, "CudaSharedMemoryStatus", [=] {
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
    return offloaded(ctx, "CudaSharedMemoryRegister", [=] {
      registry_.register_cuda(in->name(), in->raw_handle(), in->device_id(), in->byte_size());
      log::info("CUDA shared memory region '" + in->name() + "' registered (device " +
                std::to_string(in->device_id()) + ", " + std::to_string(in->byte_size()) +
                " bytes)");
    });
  }
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* ctx, const pb::CudaSharedMemoryUnregisterRequest* in,
      pb::CudaSharedMemoryUnregisterResponse*) override {
    return offloaded(ctx, "CudaSharedMemoryUnregister",
                     [=] { registry_.unregister_cuda(in->name()); });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const pb::ModelInferRequest* in,
                                       pb::ModelInferResponse* out) override {
    auto* call = new InferCall(*this, ctx, in, out);
    if (!executor_.try_submit([call] { call->run(); })) call->Finish(busy());
    return call;
  }

 private:
  template <class F>
  grpc::ServerUnaryReactor* inline_call(grpc::CallbackServerContext* ctx, const char* rpc,
                                        F&& body) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(guarded(rpc, std::forward<F>(body)));
    return reactor;
  }

  template <class F>
  grpc::ServerUnaryReactor* offloaded(grpc::CallbackServerContext* ctx, const char* rpc, F body) {
    auto* reactor = ctx->DefaultReactor();
    if (!executor_.try_submit(
            [reactor, rpc, body = std::move(body)] { reactor->Finish(guarded(rpc, body)); })) {
      reactor->Finish(busy());
    }
    return reactor;
  }

  api::InferenceService& core_;
  shm::Registry& registry_;
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

struct GrpcServer::Impl {
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
  impl_->service = std::make_unique<Service>(service, *registry, std::max(options.max_threads, 2));
  impl_->health = std::make_unique<HealthService>();
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
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &impl_->port);
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
  log::info("gRPC listening on " + options.address + " (port " + std::to_string(impl_->port) + ")");
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
