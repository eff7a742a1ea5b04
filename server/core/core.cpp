#include "server/core/core.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/StringUtil.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "kernels/hub/provider.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "kernels/report_json.h"
#include "log/log.h"
#include "models/model.h"
#include "models/runtime/device_memory.h"
#include "models/runtime/intra_op_threads.h"
#include "server/core/infer_pipeline.h"
#include "server/core/thread_pool.h"
#include "server/instance/model_instances.h"
#include "server/lifecycle/model_lifecycle.h"
#include "server/repository/model_name.h"
#include "server/tasks/detector_io.h"

namespace libreyolo::server {

using api::Code;
using api::Error;

ServerCore::ServerCore(const ServerConfig& config, Metrics& metrics, ModelFactory factory)
    : config_(config), metrics_(metrics) {
  if (!factory) {
    factory = [](const std::string& dir, const models::LoadOptions& o) {
      return models::load_model(dir, o);
    };
  }
  // Threads from the CPUs this process may use, not the host's (server/core/cpu_budget.h): a
  // container limited to 2 CPUs on a 64-core node must not run teams of 64.
  cpu_ = cpu_budget();
  if (config_.intra_op_threads.value > 0) {
    at::set_num_threads(static_cast<int>(config_.intra_op_threads.value));
    intra_op_source_ = "server.intra_op_threads";
  } else if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && *omp != 0) {
    intra_op_source_ = "OMP_NUM_THREADS";  // ATen's OpenMP runtime read it already
  } else {
    at::set_num_threads(cpu_.cores);
    intra_op_source_ = "CPU budget (" + cpu_.source + ")";
  }
  // The process's count, as every new thread starts with it (not this thread's: a thread that
  // served a request runs on itself alone, ServerCore::infer).
  intra_op_threads_ = models::process_intra_op_threads();
  // Each pool thread's ATen operators get an equal share of the cores (1 with the default pool
  // of one thread per core): otherwise every thread forks a team of all cores per resize and
  // normalise (models/runtime/intra_op_threads.h).
  const int cores = cpu_.cores;
  pool_ = std::make_unique<ThreadPool>(
      config_.preprocess_threads.value > 0 ? static_cast<int>(config_.preprocess_threads.value)
                                           : cores,
      [cores](int threads) { models::use_intra_op_threads(std::max(1, cores / threads)); });
  lifecycle_ = std::make_unique<ModelLifecycle>(config_, metrics_, std::move(factory));
  lifecycle_->lookup_hook_for_testing = [this](const std::string& name) {
    if (lookup_hook_for_testing) lookup_hook_for_testing(name);
  };
  pipeline_ = std::make_unique<InferPipeline>(config_, metrics_, *pool_);
  // Process-wide in PyTorch: set once, before any model loads.
  if (config_.tf32.value != "default") {
    const bool on = config_.tf32.value == "on";
    at::globalContext().setAllowTF32CuDNN(on);
    at::globalContext().setAllowTF32CuBLAS(on);
  }
  at::globalContext().setBenchmarkCuDNN(config_.cudnn_benchmark.value);
}

ServerCore::~ServerCore() {
  lifecycle_.reset();  // the models' instances finish their queued requests first
  pipeline_.reset();
  pool_.reset();
}

int ServerCore::load_repository() {
  std::set<std::string> load = {"*"};
  if (config_.model_control.value == "explicit")
    load =
        std::set<std::string>(config_.load_models.value.begin(), config_.load_models.value.end());
  return lifecycle_->load_repository(load);
}

void ServerCore::load_model(const std::string& name) {
  if (config_.model_control.value != "explicit") {
    throw Error(Code::permission_denied,
                "model control is disabled (server.model_control: none): models are loaded at "
                "start-up only");
  }
  if (!lifecycle_->scanned()) {
    throw Error(Code::unavailable,
                "the model repository is still loading (start-up); retry when the server is ready");
  }
  lifecycle_->load(name);
}

void ServerCore::unload_model(const std::string& name) {
  if (config_.model_control.value != "explicit") {
    throw Error(
        Code::permission_denied,
        "model control is disabled (server.model_control: none): models cannot be unloaded");
  }
  lifecycle_->unload(name);
}

void ServerCore::begin_drain() { draining_ = true; }

bool ServerCore::ready() const {
  if (draining_ || !lifecycle_->scanned()) return false;
  // Triton's strict_readiness: true, every model (but those unloaded on purpose) READY;
  // false, a live server that finished its start-up is ready whatever its models' states.
  return !config_.strict_readiness.value || lifecycle_->all_ready();
}

bool ServerCore::model_ready(const std::string& name, const std::string& version) const {
  try {
    auto e = lifecycle_->find(name, version);
    std::lock_guard<std::mutex> ek(e->mu);
    return e->state == ModelState::ready;
  } catch (const Error&) {
    return false;
  }
}

api::ServerMetadata ServerCore::server_metadata() const {
  return {"libreyolo-server", "0.1.0", {"model_configuration", "statistics", "model_repository"}};
}

namespace {

std::string platform(const ModelEntry& e) {
  return e.loaded ? "libreyolo_" + e.loaded->model->model_type() : "libreyolo";
}

/// A model that is not loaded has no task yet: its metadata shows the detector's tensors with
/// unknown sizes, as it did before it was known (Triton reports a config from the repository).
std::vector<api::TensorMetadata> input_metadata(const ModelEntry& e) {
  return e.loaded ? e.loaded->task->input_metadata() : detector_input_metadata();
}
std::vector<api::TensorMetadata> output_metadata(const ModelEntry& e) {
  return e.loaded ? e.loaded->task->output_metadata() : detector_output_metadata(-1, -1);
}

}  // namespace

api::ModelMetadata ServerCore::model_metadata(const std::string& name,
                                              const std::string& version) const {
  auto e = lifecycle_->find(name, version);
  std::lock_guard<std::mutex> ek(e->mu);
  api::ModelMetadata m;
  m.name = e->name;
  m.versions = {e->version};
  m.platform = platform(*e);
  m.inputs = input_metadata(*e);
  m.outputs = output_metadata(*e);
  return m;
}

api::ModelConfig ServerCore::model_config(const std::string& name,
                                          const std::string& version) const {
  auto e = lifecycle_->find(name, version);
  std::lock_guard<std::mutex> ek(e->mu);
  api::ModelConfig c;
  c.name = e->name;
  c.platform = platform(*e);
  c.backend = "libreyolo";
  c.max_batch_size = static_cast<int>(e->serving.max_batch_size);
  // Triton's convention: dims without the batch dimension.
  for (auto t : input_metadata(*e)) {
    t.shape.erase(t.shape.begin());
    if (t.shape.empty()) t.shape = {1};
    c.inputs.push_back(t);
  }
  for (auto t : output_metadata(*e)) {
    t.shape.erase(t.shape.begin());
    if (t.shape.empty()) t.shape = {1};
    c.outputs.push_back(t);
  }
  // instance_group as it runs: the serving.yaml entries with KIND_AUTO and empty gpus resolved,
  // else the one instance on the model's device (Triton reports its default group the same way).
  const auto gpus = static_cast<int>(at::getNumGPUs());
  if (!e->serving.instance_group.empty()) {
    for (std::size_t i = 0; i < e->serving.instance_group.size(); ++i) {
      const auto& g = e->serving.instance_group[i];
      api::InstanceGroupConfig ig;
      ig.name = e->name + "_" + std::to_string(i);
      const bool gpu = g.kind == InstanceGroup::Kind::gpu ||
                       (g.kind == InstanceGroup::Kind::automatic && gpus > 0);
      ig.kind = gpu ? "KIND_GPU" : "KIND_CPU";
      ig.count = static_cast<int>(g.count);
      if (gpu) {
        for (auto d : g.gpus) ig.gpus.push_back(static_cast<int>(d));
        if (g.gpus.empty())
          for (int d = 0; d < gpus; ++d) ig.gpus.push_back(d);
      }
      c.instance_group.push_back(std::move(ig));
    }
  } else if (e->loaded) {
    api::InstanceGroupConfig ig;
    ig.name = e->name + "_0";
    ig.kind = e->loaded->device.is_cuda() ? "KIND_GPU" : "KIND_CPU";
    if (e->loaded->device.is_cuda()) ig.gpus = {static_cast<int>(e->loaded->device.index())};
    c.instance_group.push_back(std::move(ig));
  }
  c.max_queue_delay_microseconds = e->serving.max_queue_delay_microseconds;
  // Not in Triton's ModelDynamicBatching: a parameter (server/scheduler/dynamic_batcher.h).
  c.parameters["refill_wait_fraction"] = c10::str(e->serving.refill_wait_fraction);
  c.max_queue_size = e->serving.max_queue_size;
  c.default_timeout_microseconds = e->serving.default_timeout_microseconds;
  if (e->loaded) {
    const auto& l = *e->loaded;
    for (auto& [k, v] : l.task->config_parameters()) c.parameters[k] = v;
    c.parameters["device"] = l.device.str();
    c.parameters["dtype"] = c10::toString(l.dtype);
    c.parameters["dtype_source"] = l.dtype_choice.source;
    c.parameters["task"] = l.task->name();
    c.parameters["fused_attention"] = kernels::fused_attention_name(l.fused_attention);
    c.parameters["fused_attention_source"] = l.fused_attention_source;
    c.parameters["fused_attention_modules_changed"] = std::to_string(l.fused_attention_changed);
    c.parameters["quantization"] = quantization_status(l);
    c.parameters["flush_denormals"] = l.flush_denormals ? "true" : "false";
    c.parameters["gpu_image_decode"] = l.gpu_image_decode.on ? "true" : "false";
    c.parameters["gpu_image_decode_source"] = l.gpu_image_decode.source;
  } else {
    c.parameters["threshold"] = std::to_string(e->serving.threshold);
    c.parameters["top_k"] = std::to_string(e->serving.top_k);
  }
  return c;
}

std::vector<api::ModelStatistics> ServerCore::model_statistics(const std::string& name,
                                                               const std::string& version) const {
  std::vector<std::shared_ptr<ModelEntry>> entries;
  if (name.empty()) {
    entries = lifecycle_->entries();
  } else {
    entries.push_back(lifecycle_->find(name, version));
  }
  std::vector<api::ModelStatistics> out;
  for (const auto& e : entries) {
    std::lock_guard<std::mutex> ek(e->mu);
    auto s = e->stats;
    for (const auto& [size, b] : e->batch_stats) s.batch_stats.push_back(b);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<api::RepositoryEntry> ServerCore::repository_index(bool ready_only) const {
  std::vector<api::RepositoryEntry> out;
  for (const auto& e : lifecycle_->entries()) {
    std::lock_guard<std::mutex> ek(e->mu);
    if (ready_only && e->state != ModelState::ready) continue;
    out.push_back({e->name, e->version, state_name(e->state), e->reason});
  }
  return out;
}

api::InferResponse ServerCore::infer(api::InferRequest&& request) {
  // The caller's thread (a gRPC executor thread, up to server.max_concurrent_rpcs of them, or an
  // HTTP worker) parses the request and renders the answers with ATen operators: on itself
  // alone. An OpenMP team forked here would outlive the call (libgomp keeps one per thread that
  // forked), and once the process holds more OpenMP threads than cores, libgomp cuts every
  // team's spin-wait at its barriers from about 3 ms to 100 iterations (the throttled spin
  // count, libgomp/env.c): a CPU forward's team then sleeps and is woken at each barrier
  // (docs/BENCHMARKS.md, session 38).
  static thread_local const bool one_thread = models::use_intra_op_threads(1);
  (void)one_thread;
  ModelLease lease = lifecycle_->acquire(request.model_name, request.model_version);
  return pipeline_->run(lease, request);
}

std::vector<std::string> ServerCore::instance_devices() const {
  std::vector<std::string> devices;
  for (const auto& e : lifecycle_->entries()) {
    std::shared_ptr<ModelInstances> instances;
    {
      std::lock_guard<std::mutex> ek(e->mu);
      instances = e->instances;
    }
    if (!instances) continue;
    for (const auto& st : instances->status()) devices.push_back(st.device);
  }
  return devices;
}

std::string ServerCore::active_json() const {
  using nlohmann::json;
  auto& reg = kernels::Registry::process_default();
  auto setting = [](const auto& value, kernels::Source s, const std::string& origin) {
    return json{{"value", value}, {"source", kernels::source_name(s)}, {"origin", origin}};
  };
  // The kernel state in the one schema libreyolo-kernels --json prints (kernels/report_json.h).
  json out = kernels::kernels_json(reg, config_.kernels, kernels::built_with_cuda());
  // Hub builds this process loaded (kernels/hub/provider.h): pinned by kernels.lock (either
  // format) or a local build of LOCAL_KERNELS.
  out["hub_builds"] = json::array();
  for (const auto& b : kernels::hub::loaded_builds()) {
    out["hub_builds"].push_back({{"slot", b.slot},
                                 {"repo_id", b.repo_id},
                                 {"source", b.source},
                                 {"location", b.location},
                                 {"lock_format", b.lock_format}});
  }
  json models = json::array();
  {
    for (const auto& e : lifecycle_->entries()) {
      std::lock_guard<std::mutex> ek(e->mu);
      json m = {{"name", e->name},
                {"version", e->version},
                {"state", state_name(e->state)},
                {"reason", e->reason},
                {"in_flight", e->in_flight}};
      if (e->loaded) {
        const auto& l = *e->loaded;
        m["task"] = l.task->name();
        // The compute dtype and why (server/instance/dtype_policy.h): serving.yaml, the
        // server's dtype, or the device rule ("cpu has amx_bf16").
        m["dtype"] = {{"value", l.dtype_choice.dtype}, {"source", l.dtype_choice.source}};
        // The effective per-model value: serving.yaml, else kernels.fused_attention above.
        m["fused_attention"] = {{"value", kernels::fused_attention_name(l.fused_attention)},
                                {"source", l.fused_attention_source},
                                {"modules_changed", l.fused_attention_changed}};
        // Each layout applied at load (models/layouts/): source, modules, parameters.
        json layouts = json::array();
        for (const auto& r : l.model->layouts())
          layouts.push_back({{"layout", r.layout},
                             {"source", r.source},
                             {"classes", r.classes},
                             {"modules_replaced", r.modules},
                             {"params_before", r.params_before},
                             {"params_after", r.params_after}});
        m["layouts"] = std::move(layouts);
        m["cuda_graphs"] = l.cuda_graphs_status;
        // x86 FTZ + DAZ on its instance threads (models/runtime/cpu_math.h).
        m["flush_denormals"] = l.flush_denormals;
        // server.gpu_image_decode as resolved for this device and dtype (dtype_policy.h).
        m["gpu_image_decode"] = {{"value", l.gpu_image_decode.on},
                                 {"source", l.gpu_image_decode.source}};
        // serving.yaml `quantization` (models/quantization/fp8.h): what was asked, from where,
        // and what the model runs.
        const auto& q = l.model->quantization();
        m["quantization"] = {
            {"value", models::quantization::quantization_name(l.serving.quantization)},
            {"source", l.serving.quantization_origin.empty()
                           ? std::string("default")
                           : "serving.yaml " + l.serving.quantization_origin},
            {"status", quantization_status(l)},
            {"implementation", q.implementation},
            {"layers", q.fp8.layers}};
        m["device"] = l.device.str();
        // instance_group: every instance, its device and whether it is still in rotation.
        json instances = json::array();
        if (e->instances)
          for (const auto& st : e->instances->status()) {
            json i = {{"name", st.name},   {"device", st.device},   {"healthy", st.healthy},
                      {"error", st.error}, {"batches", st.batches}, {"images", st.images}};
            if (st.intra_op_threads > 0) i["intra_op_threads"] = st.intra_op_threads;
            instances.push_back(std::move(i));
          }
        m["instances"] = std::move(instances);
      }
      models.push_back(std::move(m));
    }
  }
  const json torch = {{"tf32", config_.tf32.value},
                      {"allow_tf32_cudnn", at::globalContext().allowTF32CuDNN()},
                      {"allow_tf32_matmul", at::globalContext().allowTF32CuBLAS()},
                      {"cudnn_benchmark", at::globalContext().benchmarkCuDNN()}};
  // The server section of the configuration (kernels: "policy" above), with the origin of
  // every value as --print-config shows it.
  auto server_setting = [&](const auto& st) { return setting(st.value, st.source, st.origin); };
  const json server = {
      {"grpc_address", server_setting(config_.grpc_address)},
      {"http_address", server_setting(config_.http_address)},
      {"drain_seconds", server_setting(config_.drain_seconds)},
      {"max_message_bytes", server_setting(config_.max_message_bytes)},
      {"max_images_per_request", server_setting(config_.max_images_per_request)},
      {"max_pixels_per_image", server_setting(config_.max_pixels_per_image)},
      {"preprocess_threads", server_setting(config_.preprocess_threads)},
      {"intra_op_threads", server_setting(config_.intra_op_threads)},
      {"max_concurrent_rpcs", server_setting(config_.max_concurrent_rpcs)},
      {"model_control", server_setting(config_.model_control)},
      {"load_models", server_setting(config_.load_models)},
      {"strict_readiness", server_setting(config_.strict_readiness)},
      {"gpu_image_decode", server_setting(config_.gpu_image_decode)},
      {"log_level", server_setting(config_.log_level)},
      // As resolved and absolute (a file's relative path is relative to the file's folder).
      {"model_repository",
       setting(absolute_path(config_.model_repository.value), config_.model_repository.source,
               config_.model_repository.origin)},
      {"device", server_setting(config_.device)},
      {"dtype", server_setting(config_.dtype)},
  };
  out["models"] = std::move(models);
  // GPU memory of the devices the instances use (models/runtime/device_memory.h), bytes.
  json gpu_memory = json::array();
  for (const auto& m : models::device_memory(instance_devices()))
    gpu_memory.push_back({{"device", m.device},
                          {"total_bytes", m.total_bytes},
                          {"used_bytes", m.used_bytes},
                          {"allocated_bytes", m.allocated_bytes},
                          {"reserved_bytes", m.reserved_bytes}});
  out["gpu_memory"] = std::move(gpu_memory);
  out["ready"] = ready();
  out["draining"] = draining();
  out["torch"] = torch;
  // The threads as resolved (server/core/cpu_budget.h): what the settings above turned into.
  out["cpu"] = {{"cores", cpu_.cores},
                {"affinity_cpus", cpu_.affinity},
                {"cores_source", cpu_.source},
                {"intra_op_threads", intra_op_threads_},
                {"intra_op_threads_source", intra_op_source_},
                {"preprocess_threads", pool_->size()}};
  out["server"] = server;
  return out.dump(2);
}

}  // namespace libreyolo::server
