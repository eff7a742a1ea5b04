#include "server/core/core.h"

#include <ATen/Context.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>

#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "kernels/report_json.h"
#include "log/log.h"
#include "models/image/decode.h"
#include "models/model.h"
#include "server/core/batcher.h"
#include "server/core/classifier_io.h"
#include "server/core/detector_io.h"
#include "server/core/loaded_model.h"
#include "server/core/model_name.h"
#include "server/core/serving_config.h"
#include "server/core/thread_pool.h"

namespace libreyolo::server {

namespace fs = std::filesystem;
using api::Code;
using api::Error;

/// One model of the repository (the served version) and its statistics.
struct ModelEntry {
  std::string name, version, dir;
  mutable std::mutex mu;
  std::string state = "LOADING";
  std::string reason;
  ServingConfig serving;
  std::shared_ptr<LoadedModel> loaded;
  std::shared_ptr<Batcher> batcher;
  api::ModelStatistics stats;
  std::map<std::uint64_t, api::BatchStatistics> batch_stats;
};

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::uint64_t to_ns(double s) { return static_cast<std::uint64_t>(s * 1e9); }

void add(api::Duration& d, double s) {
  d.count += 1;
  d.ns += to_ns(s);
}

std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

/// Stacks single-image processor outputs into one batch, padding bottom/right (with a mask)
/// when sizes differ.
void stack(std::vector<image::ProcessorOutput>& parts, BatchJob& job) {
  int64_t h = 0, w = 0;
  bool same = true;
  for (const auto& p : parts) {
    const int64_t ph = p.pixel_values.size(2), pw = p.pixel_values.size(3);
    if ((h && ph != h) || (w && pw != w)) same = false;
    h = std::max(h, ph);
    w = std::max(w, pw);
  }
  const bool masked = parts[0].pixel_mask.defined();
  if (same) {
    std::vector<at::Tensor> pv, pm;
    for (auto& p : parts) {
      pv.push_back(p.pixel_values);
      if (masked) pm.push_back(p.pixel_mask);
    }
    job.pixel_values = pv.size() == 1 ? pv[0] : at::cat(pv, 0);
    if (masked) job.pixel_mask = pm.size() == 1 ? pm[0] : at::cat(pm, 0);
    return;
  }
  if (!masked) {
    throw Error(Code::invalid_argument,
                "input 'images': images resize to different sizes and the processor does not pad");
  }
  const int64_t n = static_cast<int64_t>(parts.size());
  job.pixel_values = at::zeros({n, 3, h, w}, at::kFloat);
  job.pixel_mask = at::zeros({n, h, w}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = parts[i];
    const int64_t ph = p.pixel_values.size(2), pw = p.pixel_values.size(3);
    job.pixel_values[i].narrow(1, 0, ph).narrow(2, 0, pw).copy_(p.pixel_values[0]);
    job.pixel_mask[i].narrow(0, 0, ph).narrow(1, 0, pw).copy_(p.pixel_mask[0]);
  }
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

}  // namespace

ServerCore::ServerCore(const ServerConfig& config, Metrics& metrics, ModelFactory factory)
    : config_(config), metrics_(metrics), factory_(std::move(factory)) {
  if (!factory_) {
    factory_ = [](const std::string& dir, const models::LoadOptions& o) {
      return models::load_model(dir, o);
    };
  }
  pool_ = std::make_unique<ThreadPool>(static_cast<int>(config_.preprocess_threads.value));
  // Process-wide in PyTorch: set once, before any model loads.
  if (config_.tf32.value != "default") {
    const bool on = config_.tf32.value == "on";
    at::globalContext().setAllowTF32CuDNN(on);
    at::globalContext().setAllowTF32CuBLAS(on);
  }
}

ServerCore::~ServerCore() {
  // Batchers are destroyed outside the locks: their workers finish queued requests and take
  // the entry's lock in their hooks.
  std::vector<std::shared_ptr<Batcher>> batchers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [name, e] : models_) {
      std::lock_guard<std::mutex> ek(e->mu);
      batchers.push_back(std::move(e->batcher));
    }
  }
  batchers.clear();
}

namespace {

/// Loads e->dir (version e->version), warms it up and starts its batcher; the entry is READY
/// afterwards. Throws whatever loading throws (the entry is then left as it was).
void bring_up(const std::shared_ptr<ModelEntry>& e, const ServerConfig& config, Metrics& metrics,
              const ModelFactory& factory) {
  const auto t0 = Clock::now();
  const auto serving = load_serving_config(
      (fs::path(config.model_repository.value) / e->name / "serving.yaml").string());
  auto loaded =
      load_model_version(e->name, e->version, e->dir, serving, config.device.value, factory,
                         config.kernels.fused_attention.value, config.kernels.layouts);
  const double load_s = seconds_since(t0);
  const auto t1 = Clock::now();
  if (serving.warmup) warm_up(*loaded);
  capture_cuda_graphs(*loaded);  // after the warm-up, before the first request
  const double warm_s = seconds_since(t1);
  std::weak_ptr<ModelEntry> weak = e;
  Batcher::Hooks hooks;
  hooks.pending = [&metrics, n = e->name](int64_t count) { metrics.pending(n, count); };
  hooks.executed = [&metrics, weak](int64_t size, double in_s, double infer_s, double out_s) {
    auto entry = weak.lock();
    if (!entry) return;
    metrics.batch(entry->name, size);
    std::lock_guard<std::mutex> ek(entry->mu);
    entry->stats.execution_count += 1;
    auto& b = entry->batch_stats[static_cast<std::uint64_t>(size)];
    b.batch_size = static_cast<std::uint64_t>(size);
    add(b.compute_input, in_s);
    add(b.compute_infer, infer_s);
    add(b.compute_output, out_s);
  };
  auto batcher = std::make_shared<Batcher>(loaded, std::move(hooks));
  {
    std::lock_guard<std::mutex> ek(e->mu);
    e->serving = serving;
    e->loaded = loaded;
    e->batcher = batcher;
    e->state = "READY";
    e->reason.clear();
  }
  metrics.model_load(e->name, e->version, seconds_since(t0));
  log::info(c10::str("model '", e->name, "' version ", e->version, " ready on ",
                     loaded->device.str(), " (", dtype_name(loaded->dtype), "): load ", load_s,
                     " s, warm-up ", warm_s, " s"));
}

/// Takes an entry out of service: UNAVAILABLE with `reason`; its batcher is released outside
/// the entry's lock (queued requests still finish; the last holder joins the worker, never the
/// worker itself since hooks hold the entry weakly and the entry no longer holds the batcher).
void retire(const std::shared_ptr<ModelEntry>& e, const std::string& reason) {
  std::shared_ptr<Batcher> batcher;
  {
    std::lock_guard<std::mutex> ek(e->mu);
    batcher = std::move(e->batcher);
    e->loaded.reset();
    e->state = "UNAVAILABLE";
    e->reason = reason;
  }
  batcher.reset();
}

/// RepositoryModelLoad/Unload run one at a time (as in Triton's model repository manager).
std::mutex& model_control_mutex() {
  static std::mutex mu;
  return mu;
}

const char* kControlDisabled =
    "model control is disabled (server.model_control: none): models are loaded at start-up only";

}  // namespace

int ServerCore::load_repository() {
  const auto t0 = Clock::now();
  const std::string repo = config_.model_repository.value;
  std::vector<std::shared_ptr<ModelEntry>> entries;
  std::error_code ec;
  if (!fs::is_directory(repo, ec)) {
    // Triton refuses to start without its repository too: a typo or a failed download must
    // not leave a daemon that runs but never becomes ready.
    const auto& s = config_.model_repository;
    throw std::runtime_error("model_repository " + repo + " (" +
                             (s.source == kernels::Source::default_value
                                  ? std::string("default")
                                  : std::string(kernels::source_name(s.source)) + " " + s.origin) +
                             "): not a directory");
  } else {
    std::vector<fs::path> dirs;
    for (const auto& d : fs::directory_iterator(repo, ec)) {
      if (d.is_directory() && d.path().filename().string()[0] != '.') dirs.push_back(d.path());
    }
    std::sort(dirs.begin(), dirs.end());
    for (const auto& d : dirs) {
      auto e = std::make_shared<ModelEntry>();
      e->name = d.filename().string();
      e->stats.name = e->name;
      const std::int64_t best = highest_version(d.string());
      if (best < 0) {
        e->state = "UNAVAILABLE";
        e->reason = d.string() + ": no numeric version folder (<model>/<N>/config.json)";
      } else {
        e->version = std::to_string(best);
        e->stats.version = e->version;
        e->dir = (d / e->version).string();
      }
      entries.push_back(e);
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& e : entries) models_[e->name] = e;
  }
  // At most kLoadThreads models load at once (Triton's --model-load-thread-count default):
  // one thread per model made a repository of thousands of folders start thousands of threads
  // (std::system_error, an abort, under a container's pids limit) and peak memory of every
  // model at once.
  constexpr std::size_t kLoadThreads = 4;
  std::vector<std::shared_ptr<ModelEntry>> to_load;
  for (auto& e : entries) {
    if (e->state != "LOADING") {
      log::error("model '" + e->name + "': " + e->reason);
      continue;
    }
    to_load.push_back(e);
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> loaders;
  for (std::size_t t = 0; t < std::min(kLoadThreads, to_load.size()); ++t) {
    loaders.emplace_back([this, &to_load, &next] {
      for (std::size_t i = next++; i < to_load.size(); i = next++) {
        const auto& e = to_load[i];
        try {
          bring_up(e, config_, metrics_, factory_);
        } catch (const std::exception& ex) {
          std::lock_guard<std::mutex> ek(e->mu);
          e->state = "UNAVAILABLE";
          e->reason = ex.what();
          log::error("model '" + e->name + "' failed to load: " + ex.what());
        }
      }
    });
  }
  for (auto& t : loaders) t.join();
  int ready = 0;
  for (auto& e : entries) {
    std::lock_guard<std::mutex> ek(e->mu);
    ready += e->state == "READY";
  }
  loaded_ = fs::is_directory(repo, ec);
  log::info(c10::str("repository ", repo, ": ", ready, " of ", entries.size(), " models ready in ",
                     seconds_since(t0), " s"));
  return ready;
}

void ServerCore::load_model(const std::string& name) {
  if (config_.model_control.value != "explicit") {
    throw Error(Code::permission_denied, kControlDisabled);
  }
  if (!loaded_) {
    throw Error(Code::unavailable,
                "the model repository is still loading (start-up); retry when the server is ready");
  }
  // Triton's explicit mode: re-scan this one folder of the repository, load its highest version
  // into a new entry, and swap it in only when it is READY (a failed reload keeps the served
  // version; in-flight requests of the old entry finish on its batcher).
  std::lock_guard<std::mutex> control(model_control_mutex());
  const std::string folder = model_folder(config_.model_repository.value, name);
  std::shared_ptr<ModelEntry> old;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it != models_.end()) old = it->second;
  }
  bool old_ready = false;
  if (old) {
    std::lock_guard<std::mutex> ek(old->mu);
    old_ready = old->state == "READY";
  }
  auto e = std::make_shared<ModelEntry>();
  e->name = name;
  e->stats.name = name;
  const std::int64_t best = highest_version(folder);
  std::string failure;
  if (best < 0) {
    failure = folder + ": no numeric version folder (<model>/<N>/config.json)";
  } else {
    e->version = std::to_string(best);
    e->stats.version = e->version;
    e->dir = (fs::path(folder) / e->version).string();
    try {
      bring_up(e, config_, metrics_, factory_);
    } catch (const std::exception& ex) {
      failure = ex.what();
    }
  }
  if (!failure.empty()) {
    const std::string what = "failed to load model '" + name + "'" +
                             (e->version.empty() ? "" : " version " + e->version) + ": " + failure +
                             (old_ready ? " (version " + old->version + " keeps serving)" : "");
    log::error("model control: " + what);
    if (!old_ready) {
      e->state = "UNAVAILABLE";
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
  if (old) retire(old, "replaced by version " + e->version);
  log::info("model control: model '" + name + "' " + (old_ready ? "reloaded" : "loaded") +
            ": version " + e->version + (old_ready ? " (was " + old->version + ")" : ""));
}

void ServerCore::unload_model(const std::string& name) {
  if (config_.model_control.value != "explicit") {
    throw Error(
        Code::permission_denied,
        "model control is disabled (server.model_control: none): models cannot be unloaded");
  }
  check_model_name(name);
  std::lock_guard<std::mutex> control(model_control_mutex());
  auto e = find(name, "");
  retire(e, "unloaded");  // queued and running requests finish first
  log::info("model control: model '" + name + "' unloaded");
}

void ServerCore::begin_drain() { draining_ = true; }

bool ServerCore::ready() const {
  if (draining_ || !loaded_) return false;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, e] : models_) {
    std::lock_guard<std::mutex> ek(e->mu);
    // A model the operator unloaded on purpose does not make the server unready (Triton).
    if (e->state != "READY" && e->reason != "unloaded") return false;
  }
  return true;
}

std::shared_ptr<ModelEntry> ServerCore::find(const std::string& name,
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

bool ServerCore::model_ready(const std::string& name, const std::string& version) const {
  try {
    auto e = find(name, version);
    std::lock_guard<std::mutex> ek(e->mu);
    return e->state == "READY";
  } catch (const Error&) {
    return false;
  }
}

api::ServerMetadata ServerCore::server_metadata() const {
  return {"libreyolo-server", "0.1.0", {"model_configuration", "statistics", "model_repository"}};
}

api::ModelMetadata ServerCore::model_metadata(const std::string& name,
                                              const std::string& version) const {
  auto e = find(name, version);
  std::lock_guard<std::mutex> ek(e->mu);
  api::ModelMetadata m;
  m.name = e->name;
  m.versions = {e->version};
  m.platform = e->loaded ? "libreyolo_" + e->loaded->model->model_type() : "libreyolo";
  if (e->loaded && e->loaded->is_classifier()) {
    m.inputs = classifier_input_metadata();
    m.outputs = classifier_output_metadata(e->loaded->num_labels);
  } else {
    m.inputs = detector_input_metadata();
    m.outputs = detector_output_metadata(e->loaded ? e->loaded->num_queries : -1,
                                         e->loaded ? e->loaded->num_labels : -1);
  }
  return m;
}

api::ModelConfig ServerCore::model_config(const std::string& name,
                                          const std::string& version) const {
  auto e = find(name, version);
  std::lock_guard<std::mutex> ek(e->mu);
  api::ModelConfig c;
  c.name = e->name;
  c.platform = e->loaded ? "libreyolo_" + e->loaded->model->model_type() : "libreyolo";
  c.backend = "libreyolo";
  c.max_batch_size = static_cast<int>(e->serving.max_batch_size);
  const bool classifier = e->loaded && e->loaded->is_classifier();
  // Triton's convention: dims without the batch dimension.
  for (auto t : classifier ? classifier_input_metadata() : detector_input_metadata()) {
    t.shape.erase(t.shape.begin());
    if (t.shape.empty()) t.shape = {1};
    c.inputs.push_back(t);
  }
  for (auto t : classifier ? classifier_output_metadata(e->loaded->num_labels)
                           : detector_output_metadata(e->loaded ? e->loaded->num_queries : -1,
                                                      e->loaded ? e->loaded->num_labels : -1)) {
    t.shape.erase(t.shape.begin());
    if (t.shape.empty()) t.shape = {1};
    c.outputs.push_back(t);
  }
  c.max_queue_delay_microseconds = e->serving.max_queue_delay_microseconds;
  c.max_queue_size = e->serving.max_queue_size;
  c.default_timeout_microseconds = e->serving.default_timeout_microseconds;
  if (!classifier) c.parameters["threshold"] = std::to_string(e->serving.threshold);
  c.parameters["top_k"] = std::to_string(e->serving.top_k);
  if (e->loaded) {
    c.parameters["device"] = e->loaded->device.str();
    c.parameters["dtype"] = dtype_name(e->loaded->dtype);
    c.parameters["task"] = classifier ? "image_classification" : "object_detection";
    c.parameters["fused_attention"] = kernels::fused_attention_name(e->loaded->fused_attention);
    c.parameters["fused_attention_source"] = e->loaded->fused_attention_source;
    c.parameters["fused_attention_modules_changed"] =
        std::to_string(e->loaded->fused_attention_changed);
  }
  return c;
}

std::vector<api::ModelStatistics> ServerCore::model_statistics(const std::string& name,
                                                               const std::string& version) const {
  std::vector<std::shared_ptr<ModelEntry>> entries;
  if (name.empty()) {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [n, e] : models_) entries.push_back(e);
  } else {
    entries.push_back(find(name, version));
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
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, e] : models_) {
    std::lock_guard<std::mutex> ek(e->mu);
    if (ready_only && e->state != "READY") continue;
    out.push_back({e->name, e->version, e->state, e->reason});
  }
  return out;
}

ServerCore::Serving ServerCore::acquire(const std::string& name, const std::string& version) const {
  // One critical section for the lookup and the state check: load_model swaps a reloaded
  // entry into models_ under mu_ and only then retires the old one, so an entry found here is
  // either READY (its batcher and model are taken, and the request finishes on them even if a
  // reload retires the entry a moment later: the drain) or out of service on purpose
  // (unloaded, failed). Looking up and checking under two separate locks answered a request
  // racing a reload UNAVAILABLE "replaced by version N".
  Serving s;
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
  if (s.entry->state == "READY") {
    s.loaded = s.entry->loaded;
    s.batcher = s.entry->batcher;
  } else {
    s.not_ready = "model '" + s.entry->name + "' is not ready (" + s.entry->state +
                  (s.entry->reason.empty() ? "" : ": " + s.entry->reason) + ")";
  }
  return s;
}

api::InferResponse ServerCore::infer(api::InferRequest&& request) {
  const auto t0 = Clock::now();
  Serving serving = acquire(request.model_name, request.model_version);
  auto& e = serving.entry;
  try {
    auto response = infer_on(serving, request);
    const double s = seconds_since(t0);
    metrics_.request(e->name, e->version, "OK", s);
    std::lock_guard<std::mutex> ek(e->mu);
    add(e->stats.success, s);
    return response;
  } catch (const Error& err) {
    const double s = seconds_since(t0);
    metrics_.request(e->name, e->version, api::code_name(err.code()), s);
    std::lock_guard<std::mutex> ek(e->mu);
    add(e->stats.fail, s);
    throw;
  } catch (const std::exception& ex) {
    const double s = seconds_since(t0);
    metrics_.request(e->name, e->version, "INTERNAL", s);
    {
      std::lock_guard<std::mutex> ek(e->mu);
      add(e->stats.fail, s);
    }
    // c10::Error's what() carries the C++ backtrace: log it, answer without it.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&ex);
    log::error("model '" + e->name + "': " + ex.what());
    throw Error(Code::internal, "model '" + e->name + "': " +
                                    (c10_error ? c10_error->what_without_backtrace() : ex.what()));
  }
}

api::InferResponse ServerCore::infer_on(Serving& serving, api::InferRequest& request) {
  if (!serving.loaded) throw Error(Code::unavailable, serving.not_ready);
  ModelEntry& entry = *serving.entry;
  const std::shared_ptr<LoadedModel>& m = serving.loaded;
  const std::shared_ptr<Batcher>& batcher = serving.batcher;
  RequestLimits limits;
  limits.max_images = config_.max_images_per_request.value;
  limits.max_pixels = config_.max_pixels_per_image.value;
  limits.max_batch_size = m->serving.max_batch_size;
  const auto& pc = m->processor->config();
  std::tie(limits.max_model_pixels, limits.model_pixels_reason) =
      model_pixel_limit(pc.height, pc.width, pc.shortest_edge, pc.longest_edge, pc.do_resize);
  const bool classifier = m->is_classifier();
  DetectorRequest req;
  if (classifier) {
    // The classifier's inputs are a subset of the detector's: carry them in the same struct
    // through decoding, preprocessing and batching (no target_sizes, post.top_k = K).
    auto c = parse_classifier_request(request, limits, m->serving.top_k);
    req.images = std::move(c.images);
    req.pixel_values = c.pixel_values;
    req.batch = c.batch;
    req.post.top_k = c.top_k;
    req.outputs = std::move(c.outputs);
  } else {
    req = parse_detector_request(request, limits, m->serving.threshold, m->serving.top_k);
    req.post.use_focal_loss = m->use_focal_loss;
  }

  const auto t_pre = Clock::now();
  auto job = std::make_shared<BatchJob>();
  if (!req.images.empty()) {
    std::vector<std::future<image::ProcessorOutput>> futures;
    for (std::size_t i = 0; i < req.images.size(); ++i) {
      futures.push_back(pool_->submit([&req, &m, &limits, i] {
        image::DecodeOptions options;
        options.max_pixels = limits.max_pixels;
        const auto* data = reinterpret_cast<const std::uint8_t*>(req.images[i].data());
        at::Tensor img;
        try {
          img = image::decode_image(data, req.images[i].size(), options);
        } catch (const std::exception& ex) {
          throw Error(Code::invalid_argument,
                      c10::str("input 'images': image ", i, ": ", ex.what()));
        }
        try {
          return m->processor->preprocess({img});
        } catch (const c10::OutOfMemoryError&) {
          throw;
        } catch (const c10::Error& ex) {
          // ATen's checks on the image's own size, e.g. a 40000x1 image that Deformable DETR's
          // shortest/longest-edge resize maps to 0 rows (transformers fails on it too): the
          // client's input, not a server failure.
          throw Error(Code::invalid_argument,
                      c10::str("input 'images': image ", i, " (", img.size(2), "x", img.size(1),
                               " pixels) cannot be preprocessed: ", ex.what_without_backtrace()));
        }
      }));
    }
    std::vector<image::ProcessorOutput> parts;
    std::exception_ptr first_error;
    for (auto& f : futures) {  // wait for every task: they reference `req`
      try {
        parts.push_back(f.get());
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
    stack(parts, *job);
    if (req.target_sizes.empty()) {
      for (const auto& p : parts) job->target_sizes.push_back(p.original_sizes.at(0));
    }
  } else {
    job->pixel_values = req.pixel_values;
    if (m->processor->config().do_pad) {
      job->pixel_mask =
          at::ones({req.batch, req.pixel_values.size(2), req.pixel_values.size(3)}, at::kLong);
    }
    if (req.target_sizes.empty()) {
      job->target_sizes.assign(req.batch, {req.pixel_values.size(2), req.pixel_values.size(3)});
    }
  }
  if (!req.target_sizes.empty()) job->target_sizes = req.target_sizes;
  const double pre_s = seconds_since(t_pre);
  metrics_.preprocess(entry.name, entry.version, pre_s);

  job->post = req.post;
  job->want_raw = !classifier && (req.outputs.count("logits") || req.outputs.count("pred_boxes"));
  job->deadline = request.deadline;
  if (!job->deadline && m->serving.default_timeout_microseconds > 0) {
    job->deadline =
        Clock::now() + std::chrono::microseconds(m->serving.default_timeout_microseconds);
  }
  const std::shared_ptr<api::CancelToken> token = request.cancel;
  if (token) job->cancelled = [token] { return token->cancelled(); };
  auto future = batcher->submit(job);
  // A cancelled call frees its queue slot at once (one already running finishes; gRPC drops its
  // answer): the token's notification takes the job out of the queue and answers it with the
  // token's reason (CANCELLED, or DEADLINE_EXCEEDED from the transport's deadline timer), which
  // wakes future.get() below. No polling: the wait ends with the answer or the notification.
  std::optional<BatchResult> result;
  if (token) {
    const int id = token->subscribe([batcher, job, token] {
      batcher->cancel(job, token->reason() == Code::deadline_exceeded ? Code::deadline_exceeded
                                                                      : Code::cancelled);
    });
    try {
      result.emplace(future.get());
    } catch (...) {
      token->unsubscribe(id);
      throw;
    }
    token->unsubscribe(id);
  } else {
    result.emplace(future.get());
  }
  BatchResult& r = *result;  // future.get() threw api::Error (deadline, cancelled, failure)
  metrics_.queue(entry.name, entry.version, r.queue_seconds);
  metrics_.compute(entry.name, entry.version, r.input_seconds + r.infer_seconds + r.output_seconds);
  {
    std::lock_guard<std::mutex> ek(entry.mu);
    entry.stats.inference_count += static_cast<std::uint64_t>(req.batch);
    entry.stats.last_inference_ms = now_ms();
    add(entry.stats.queue, r.queue_seconds);
    add(entry.stats.compute_input, pre_s + r.input_seconds);
    add(entry.stats.compute_infer, r.infer_seconds);
    add(entry.stats.compute_output, r.output_seconds);
  }
  api::InferResponse response;
  response.model_name = entry.name;
  response.model_version = entry.version;
  response.id = request.id;
  response.outputs = classifier ? classifier_outputs(r.logits, r.classifications,
                                                     m->model->id2label(), req.outputs)
                                : detector_outputs(r.detections, r.logits, r.pred_boxes,
                                                   m->model->id2label(), req.outputs);
  return response;
}

std::string ServerCore::active_json() const {
  using nlohmann::json;
  auto& reg = kernels::Registry::process_default();
  auto setting = [](const auto& value, kernels::Source s, const std::string& origin) {
    return json{{"value", value}, {"source", kernels::source_name(s)}, {"origin", origin}};
  };
  // The kernel state in the one schema libreyolo-kernels --json prints (kernels/report_json.h).
  json out = kernels::kernels_json(reg, config_.kernels, kernels::built_with_cuda());
  json models = json::array();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [n, e] : models_) {
      std::lock_guard<std::mutex> ek(e->mu);
      json m = {
          {"name", e->name}, {"version", e->version}, {"state", e->state}, {"reason", e->reason}};
      if (e->loaded) {
        const auto& l = *e->loaded;
        m["task"] = l.is_classifier() ? "image_classification" : "object_detection";
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
        m["device"] = l.device.str();
      }
      models.push_back(std::move(m));
    }
  }
  const json torch = {{"tf32", config_.tf32.value},
                      {"allow_tf32_cudnn", at::globalContext().allowTF32CuDNN()},
                      {"allow_tf32_matmul", at::globalContext().allowTF32CuBLAS()}};
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
      {"max_concurrent_rpcs", server_setting(config_.max_concurrent_rpcs)},
      {"model_control", server_setting(config_.model_control)},
      {"log_level", server_setting(config_.log_level)},
      // As resolved and absolute (a file's relative path is relative to the file's folder).
      {"model_repository",
       setting(absolute_path(config_.model_repository.value), config_.model_repository.source,
               config_.model_repository.origin)},
      {"device", server_setting(config_.device)},
  };
  out["models"] = std::move(models);
  out["ready"] = ready();
  out["draining"] = draining();
  out["torch"] = torch;
  out["server"] = server;
  return out.dump(2);
}

}  // namespace libreyolo::server
