#include "server/lifecycle/model_lifecycle.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "kernels/policy.h"
#include "log/log.h"
#include "server/instance/model_instances.h"
#include "server/metrics/statistics.h"
#include "server/scheduler/dynamic_batcher.h"

namespace libreyolo::server {
namespace {

/// An exception's message without LibTorch's C++ backtrace (c10::Error::what() carries one: a
/// load error answered 6.7 KB of "frame #0 ..." to the client).
std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace

using api::Code;
using api::Error;

namespace {

/// Takes an entry out of service: UNLOADING while requests that hold a lease still run, then
/// UNAVAILABLE with `reason`. Its instances are released outside the entry's lock (queued requests
/// still finish; the last holder joins the workers, never a worker itself since hooks hold the
/// entry weakly and the entry no longer holds the instances).
void retire(const std::shared_ptr<ModelEntry>& e, const std::string& reason, bool unloaded) {
  std::shared_ptr<ModelInstances> instances;
  {
    std::lock_guard<std::mutex> ek(e->mu);
    instances = std::move(e->instances);
    e->loaded.reset();
    e->state = e->in_flight > 0 ? ModelState::unloading : ModelState::unavailable;
    e->reason = reason;
    e->unloaded = unloaded;
  }
  instances.reset();
}

}  // namespace

ModelLease::ModelLease(ModelLease&& o) noexcept
    : entry(std::move(o.entry)),
      loaded(std::move(o.loaded)),
      instances(std::move(o.instances)),
      not_ready(std::move(o.not_ready)) {}

ModelLease::~ModelLease() {
  if (!entry || !loaded) return;
  loaded.reset();
  instances.reset();
  std::lock_guard<std::mutex> ek(entry->mu);
  // The last request of a retired version: it is now out of service.
  if (--entry->in_flight == 0 && entry->state == ModelState::unloading)
    entry->state = ModelState::unavailable;
}

ModelLifecycle::ModelLifecycle(const ServerConfig& config, Metrics& metrics, ModelLoader factory)
    : config_(config),
      metrics_(metrics),
      factory_(std::move(factory)),
      repository_(config.model_repository.value,
                  config.model_repository.source == kernels::Source::default_value
                      ? std::string("default")
                      : std::string(kernels::source_name(config.model_repository.source)) + " " +
                            config.model_repository.origin) {}

ModelLifecycle::~ModelLifecycle() {
  // Instances are destroyed outside the locks: their workers finish queued requests and take
  // the entry's lock in their hooks.
  std::vector<std::shared_ptr<ModelInstances>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [name, e] : models_) {
      std::lock_guard<std::mutex> ek(e->mu);
      all.push_back(std::move(e->instances));
    }
  }
  all.clear();
}

void ModelLifecycle::bring_up(const std::shared_ptr<ModelEntry>& e, const ModelSource& source) {
  const auto t0 = Clock::now();
  const auto serving = load_serving_config(source.serving_yaml);
  // One LoadedModel per instance (instance_group), each with its own weights on its device,
  // its layouts and kernel handles, warm-up and CUDA graphs.
  const auto devices = instance_devices(serving, config_.device.value);
  // What every instance loads with, built once: the version, its serving.yaml and the server's
  // settings it may override; each instance then sets its device and name.
  InstanceOptions base;
  base.name = e->name;
  base.version = e->version;
  base.dir = e->dir;
  base.serving = serving;
  base.server_device = config_.device.value;
  base.server_dtype = config_.dtype;
  base.server_fused_attention = config_.kernels.fused_attention.value;
  base.gpu_image_decode = config_.gpu_image_decode;
  base.server_layouts = config_.kernels.layouts;
  std::vector<std::shared_ptr<LoadedModel>> instances;
  double load_s = 0, warm_s = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const auto t_load = Clock::now();
    InstanceOptions options = base;
    options.serving.device = devices[i];
    options.instance = devices.size() > 1 ? e->name + "_" + std::to_string(i) : std::string();
    auto loaded = load_model_version(options, factory_);
    load_s += seconds_since(t_load);
    const auto t_warm = Clock::now();
    if (serving.warmup) warm_up(*loaded);
    capture_cuda_graphs(*loaded);  // after the warm-up, before the first request
    warm_s += seconds_since(t_warm);
    instances.push_back(std::move(loaded));
  }
  std::weak_ptr<ModelEntry> weak = e;
  std::vector<std::pair<std::string, std::string>> names;  // (instance, device) for the metrics
  for (std::size_t i = 0; i < instances.size(); ++i)
    names.emplace_back(e->name + "_" + std::to_string(i), instances[i]->device.str());
  InstanceHooks hooks;
  hooks.executed = [&metrics = metrics_, weak, names](const ExecutedBatch& x) {
    auto entry = weak.lock();
    if (!entry) return;
    const auto& [instance, device] = names[x.instance];
    metrics.batch(entry->name, x.images);
    metrics.instance_batch(entry->name, instance, device, x.images,
                           x.input_seconds + x.infer_seconds, x.device_seconds);
    metrics.instance_queue(entry->name, instance, device, x.requests, x.queue_seconds);
    if (x.prompt_cache_hits + x.prompt_cache_misses > 0)
      metrics.prompt_cache(entry->name, instance, device, x.prompt_cache_hits,
                           x.prompt_cache_misses);
    // Both counts under one lock: a statistics reader (perf_analyzer takes deltas) never sees a
    // batch's execution without its inferences.
    std::lock_guard<std::mutex> ek(entry->mu);
    entry->stats.execution_count += 1;
    // Every image the forward ran; a request whose own rendering then fails takes its images
    // back (InferPipeline), so that inference_count counts answered ones as Triton's does. The
    // requests add their rendering time to compute_output; its count is the batch's.
    entry->stats.inference_count += static_cast<std::uint64_t>(x.images);
    auto& b = entry->batch_stats[static_cast<std::uint64_t>(x.images)];
    b.batch_size = static_cast<std::uint64_t>(x.images);
    add_duration(b.compute_input, x.input_seconds);
    add_duration(b.compute_infer, x.infer_seconds);
    b.compute_output.count += 1;
  };
  hooks.instance_failed = [&metrics = metrics_, weak, names, model = e->name](
                              std::size_t instance, const std::string& what, std::size_t left) {
    metrics.instance_ready(model, names[instance].first, names[instance].second, false);
    auto entry = weak.lock();
    if (!entry || left > 0) return;
    // Every instance failed: the model is out of service, with the last error as its reason.
    std::lock_guard<std::mutex> ek(entry->mu);
    if (entry->state == ModelState::ready) {
      entry->state = ModelState::unavailable;
      entry->reason = "every instance failed; last: " + what;
    }
  };
  for (const auto& [instance, device] : names)
    metrics_.instance_ready(e->name, instance, device, true);
  // Before the first request: the batched GPU decode's rounds in /metrics.
  for (const auto& loaded : instances)
    if (loaded->decode_batcher)
      loaded->decode_batcher->set_observer(
          [&metrics = metrics_, n = e->name](const DecodeBatcher::RoundStats& r) {
            metrics.decode_round(n, static_cast<std::int64_t>(r.images), r.seconds, r.failed);
          });
  // The queue policy: Triton's dynamic batcher (another Scheduler changes it for every instance).
  auto scheduler = std::make_unique<DynamicBatcher>(
      e->name, instances.front()->serving, instances.size(),
      [&metrics = metrics_, n = e->name](int64_t count) { metrics.pending(n, count); });
  auto running =
      std::make_shared<ModelInstances>(std::move(scheduler), instances, std::move(hooks));
  {
    std::lock_guard<std::mutex> ek(e->mu);
    e->serving = serving;
    e->loaded = instances.front();
    e->instances = running;
    e->state = ModelState::ready;
    e->reason.clear();
    e->unloaded = false;
  }
  metrics_.model_load(e->name, e->version, seconds_since(t0));
  std::string where;
  for (const auto& l : instances) where += (where.empty() ? "" : ", ") + l->device.str();
  log::info(c10::str("model '", e->name, "' version ", e->version, " ready on ", where, " (",
                     c10::toString(instances.front()->dtype), "): load ", load_s, " s, warm-up ",
                     warm_s, " s"));
}

int ModelLifecycle::load_repository(const std::set<std::string>& load) {
  const auto t0 = Clock::now();
  const auto sources = repository_.scan();  // throws when the root is not a folder
  const bool all = load.count("*") > 0;
  std::vector<std::pair<std::shared_ptr<ModelEntry>, ModelSource>> to_load;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& s : sources) {
      auto e = std::make_shared<ModelEntry>();
      e->name = s.name;
      e->version = s.version;
      e->dir = s.dir;
      e->stats.name = s.name;
      e->stats.version = s.version;
      if (!all && !load.count(s.name)) {
        e->state = ModelState::unavailable;
        e->reason = "unloaded";
        e->unloaded = true;
      } else if (!s.error.empty()) {
        e->state = ModelState::unavailable;
        e->reason = s.error;
        log::error("model '" + e->name + "': " + e->reason);
      } else {
        e->state = ModelState::loading;
        to_load.emplace_back(e, s);
      }
      models_[e->name] = e;
    }
    for (const auto& name : load) {
      if (name != "*" && !models_.count(name))
        log::error("--load-model " + quoted_name(name) + ": no such folder in model_repository " +
                   repository_.root());
    }
  }
  // At most kLoadThreads models load at once (Triton's --model-load-thread-count default):
  // one thread per model made a repository of thousands of folders start thousands of threads
  // (std::system_error, an abort, under a container's pids limit) and peak memory of every
  // model at once.
  constexpr std::size_t kLoadThreads = 4;
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> loaders;
  for (std::size_t t = 0; t < std::min(kLoadThreads, to_load.size()); ++t) {
    loaders.emplace_back([this, &to_load, &next] {
      for (std::size_t i = next++; i < to_load.size(); i = next++) {
        const auto& [e, source] = to_load[i];
        try {
          bring_up(e, source);
        } catch (const std::exception& ex) {
          std::lock_guard<std::mutex> ek(e->mu);
          e->state = ModelState::unavailable;
          e->reason = message_of(ex);
          log::error("model '" + e->name + "' failed to load: " + e->reason);
        }
      }
    });
  }
  for (auto& t : loaders) t.join();
  int ready = 0;
  for (const auto& e : entries()) {
    std::lock_guard<std::mutex> ek(e->mu);
    ready += e->state == ModelState::ready;
  }
  scanned_ = true;
  log::info(c10::str("repository ", repository_.root(), ": ", ready, " of ", sources.size(),
                     " models ready in ", seconds_since(t0), " s"));
  return ready;
}

void ModelLifecycle::load(const std::string& name) {
  // Triton's explicit mode: re-scan this one folder of the repository, load its highest version
  // into a new entry, and swap it in only when it is READY (a failed reload keeps the served
  // version; in-flight requests of the old entry finish on its instances).
  std::lock_guard<std::mutex> control(control_mu_);
  const ModelSource source = repository_.locate(name);
  std::shared_ptr<ModelEntry> old;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it != models_.end()) old = it->second;
  }
  bool old_ready = false;
  if (old) {
    std::lock_guard<std::mutex> ek(old->mu);
    old_ready = old->state == ModelState::ready;
  }
  auto e = std::make_shared<ModelEntry>();
  e->name = name;
  e->stats.name = name;
  e->version = source.version;
  e->dir = source.dir;
  e->stats.version = source.version;
  e->state = ModelState::loading;
  std::string failure = source.error;
  if (failure.empty()) {
    try {
      // On a thread of its own, as at start-up: the caller (a gRPC executor thread or an HTTP
      // worker) runs ATen on itself alone (ServerCore::infer), and the OpenMP team that the
      // load and warm-up fork ends with this thread (libgomp keeps a team per thread).
      std::async(std::launch::async, [&] { bring_up(e, source); }).get();  // rethrows
    } catch (const std::exception& ex) {
      failure = message_of(ex);
    }
  }
  if (!failure.empty()) {
    const std::string what = "failed to load model '" + name + "'" +
                             (e->version.empty() ? "" : " version " + e->version) + ": " + failure +
                             (old_ready ? " (version " + old->version + " keeps serving)" : "");
    log::error("model control: " + what);
    if (!old_ready) {
      e->state = ModelState::unavailable;
      e->reason = failure;
      std::lock_guard<std::mutex> lk(mu_);
      models_[name] = e;
    }
    throw Error(Code::internal, what);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    models_[name] = e;
  }
  if (old) retire(old, "replaced by version " + e->version, /*unloaded=*/false);
  log::info("model control: model '" + name + "' " + (old_ready ? "reloaded" : "loaded") +
            ": version " + e->version + (old_ready ? " (was " + old->version + ")" : ""));
}

void ModelLifecycle::unload(const std::string& name) {
  check_model_name(name);
  std::lock_guard<std::mutex> control(control_mu_);
  auto e = find(name, "");
  retire(e, "unloaded", /*unloaded=*/true);  // queued and running requests finish first
  log::info("model control: model '" + name + "' unloaded");
}

std::shared_ptr<ModelEntry> ModelLifecycle::find(const std::string& name,
                                                 const std::string& version) const {
  std::shared_ptr<ModelEntry> e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) throw Error(Code::not_found, "unknown model " + quoted_name(name));
    e = it->second;
  }
  if (!version.empty() && version != e->version) {
    throw Error(Code::not_found, "model " + quoted_name(name) + " has no version " +
                                     quoted_name(version) + " (served: '" + e->version + "')");
  }
  return e;
}

ModelLease ModelLifecycle::acquire(const std::string& name, const std::string& version) const {
  // One critical section for the lookup and the state check: load() swaps a reloaded entry into
  // models_ under mu_ and only then retires the old one, so an entry found here is either READY
  // (its instances and model are taken, and the request finishes on them even if a reload
  // retires the entry a moment later: the drain) or out of service on purpose (unloaded,
  // failed). Looking up and checking under two separate locks answered a request racing a
  // reload UNAVAILABLE "replaced by version N".
  ModelLease s;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) throw Error(Code::not_found, "unknown model " + quoted_name(name));
  s.entry = it->second;
  if (!version.empty() && version != s.entry->version) {
    throw Error(Code::not_found, "model " + quoted_name(name) + " has no version " +
                                     quoted_name(version) + " (served: '" + s.entry->version +
                                     "')");
  }
  if (lookup_hook_for_testing) lookup_hook_for_testing(name);
  std::lock_guard<std::mutex> ek(s.entry->mu);
  if (s.entry->state == ModelState::ready) {
    s.loaded = s.entry->loaded;
    s.instances = s.entry->instances;
    ++s.entry->in_flight;
  } else {
    s.not_ready = "model '" + s.entry->name + "' is not ready (" + state_name(s.entry->state) +
                  (s.entry->reason.empty() ? "" : ": " + s.entry->reason) + ")";
  }
  return s;
}

std::vector<std::shared_ptr<ModelEntry>> ModelLifecycle::entries() const {
  std::vector<std::shared_ptr<ModelEntry>> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, e] : models_) out.push_back(e);
  return out;
}

bool ModelLifecycle::all_ready() const {
  for (const auto& e : entries()) {
    std::lock_guard<std::mutex> ek(e->mu);
    // A model the operator unloaded on purpose does not make the server unready (Triton).
    if (e->state != ModelState::ready && !e->unloaded) return false;
  }
  return true;
}

}  // namespace libreyolo::server
