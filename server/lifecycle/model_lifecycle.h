// The life cycle of the repository's models, after Triton's model_lifecycle: load (a bounded
// pool at start-up, one at a time for model control), warm-up, swap a reloaded version in only
// once it is READY, retire the old one, and account for the requests each version still runs
// (a retired version is UNLOADING until its last request is answered).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/api/types.h"
#include "server/config/config.h"
#include "server/config/serving_config.h"
#include "server/instance/loaded_model.h"
#include "server/instance/model_instances.h"
#include "server/metrics/metrics.h"
#include "server/repository/model_repository.h"
#include "server/repository/model_state.h"

namespace libreyolo::server {

/// One model of the repository (the served version), its state and its statistics.
struct ModelEntry {
  std::string name, version, dir;
  mutable std::mutex mu;  ///< guards everything below
  ModelState state = ModelState::unknown;
  std::string reason;  ///< why it is not READY ("" when READY)
  /// Taken out of service by the operator (unload, or not named at an explicit start-up):
  /// readiness ignores it, as Triton's does.
  bool unloaded = false;
  ServingConfig serving;
  std::shared_ptr<LoadedModel> loaded;
  /// Its instances and their scheduler (null when not READY).
  std::shared_ptr<ModelInstances> instances;
  std::int64_t in_flight = 0;  ///< requests holding a ModelLease
  api::ModelStatistics stats;
  std::map<std::uint64_t, api::BatchStatistics> batch_stats;
};

/// What one request runs on: the entry and, when it was READY, its model and instances, held
/// until the request is answered (a reload or unload drains it instead of failing it).
class ModelLease {
 public:
  ModelLease() = default;
  ModelLease(ModelLease&& other) noexcept;
  ModelLease& operator=(ModelLease&&) = delete;
  ModelLease(const ModelLease&) = delete;
  ~ModelLease();

  std::shared_ptr<ModelEntry> entry;
  std::shared_ptr<LoadedModel> loaded;        ///< null when the entry was not READY
  std::shared_ptr<ModelInstances> instances;  ///< null when the entry was not READY
  std::string not_ready;                      ///< the UNAVAILABLE message when loaded is null
};

class ModelLifecycle {
 public:
  ModelLifecycle(const ServerConfig& config, Metrics& metrics, ModelLoader factory);
  /// Finishes every model's queued requests (outside the locks).
  ~ModelLifecycle();

  /// Scans the repository and loads, at most 4 at a time (Triton's --model-load-thread-count
  /// default), the models `load` names ("*": all); the others are UNAVAILABLE "unloaded".
  /// A model that fails is UNAVAILABLE with its reason. Returns the number READY. Throws
  /// std::runtime_error when model_repository is not a directory (ModelRepository::scan).
  int load_repository(const std::set<std::string>& load);

  /// Model control (explicit): re-scans the folder, loads its highest version into a new entry
  /// and swaps it in once READY; the old version is retired after its requests finish. Throws
  /// api::Error (INVALID_ARGUMENT / NOT_FOUND for the name, INTERNAL for a failed load: the
  /// served version, if any, keeps serving).
  void load(const std::string& name);

  /// Retires the model ("unloaded"). Throws api::Error NOT_FOUND for an unknown model.
  void unload(const std::string& name);

  /// The entry of `name` (any state). Throws api::Error NOT_FOUND for an unknown model, or a
  /// `version` other than the served one.
  std::shared_ptr<ModelEntry> find(const std::string& name, const std::string& version) const;

  /// find() and the READY check in one critical section. Throws NOT_FOUND like find().
  ModelLease acquire(const std::string& name, const std::string& version) const;

  /// Every entry, sorted by name.
  std::vector<std::shared_ptr<ModelEntry>> entries() const;

  /// Whether the start-up scan finished.
  bool scanned() const { return scanned_; }

  /// Every model READY except those unloaded on purpose (Triton's strict readiness).
  bool all_ready() const;

  const ModelRepository& repository() const { return repository_; }

  /// Tests only: acquire() calls it with the model name once the model is looked up, before
  /// its readiness is checked (under the lifecycle's lock). Set it before any request.
  std::function<void(const std::string&)> lookup_hook_for_testing;

 private:
  /// Loads, warms up and starts the instances of `e` (READY afterwards). Throws what loading
  /// throws.
  void bring_up(const std::shared_ptr<ModelEntry>& e, const ModelSource& source);

  const ServerConfig& config_;
  Metrics& metrics_;
  ModelLoader factory_;
  ModelRepository repository_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ModelEntry>> models_;
  std::mutex control_mu_;  ///< model control runs one load/unload at a time (Triton)
  std::atomic<bool> scanned_{false};
};

}  // namespace libreyolo::server
