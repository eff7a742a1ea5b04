// The serving core: the model repository, per-model batchers, statistics and metrics behind
// api::InferenceService (implemented here, on the torch side; the gRPC transport only sees
// the interface). No torch in this header.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/api/types.h"
#include "server/core/config.h"
#include "server/core/metrics.h"

namespace libreyolo::models {
struct LoadOptions;
class Model;
}  // namespace libreyolo::models

namespace libreyolo::server {

class ThreadPool;
struct ModelEntry;
struct LoadedModel;
class Batcher;

/// Loads a checkpoint folder (models::load_model in the daemon; tests inject fakes).
using ModelFactory = std::function<std::unique_ptr<models::Model>(const std::string& dir,
                                                                  const models::LoadOptions&)>;

class ServerCore : public api::InferenceService {
 public:
  /// `factory` empty: models::load_model.
  ServerCore(const ServerConfig& config, Metrics& metrics, ModelFactory factory = {});
  ~ServerCore() override;

  /// Scans model_repository (<model>/<numeric version>/; highest version served; optional
  /// <model>/serving.yaml), loads every model in parallel and warms each up. A model that fails
  /// is UNAVAILABLE with its reason and readiness stays false; the others serve.
  /// Returns the number of models ready. Throws std::runtime_error when model_repository is not
  /// a directory ("model_repository DIR (flag --model-repository): not a directory"): the daemon
  /// then exits 1 instead of running without ever being ready.
  int load_repository();

  /// Readiness false from now on (SIGTERM); requests are still served.
  void begin_drain();
  bool draining() const { return draining_; }

  /// JSON for GET /active: kernel policy and table, fallback events, models.
  std::string active_json() const;

  // api::InferenceService
  bool live() const override { return true; }
  bool ready() const override;
  bool model_ready(const std::string& name, const std::string& version) const override;
  api::ServerMetadata server_metadata() const override;
  api::ModelMetadata model_metadata(const std::string& name,
                                    const std::string& version) const override;
  api::ModelConfig model_config(const std::string& name, const std::string& version) const override;
  std::vector<api::ModelStatistics> model_statistics(const std::string& name,
                                                     const std::string& version) const override;
  std::vector<api::RepositoryEntry> repository_index(bool ready_only) const override;
  void load_model(const std::string& name) override;
  void unload_model(const std::string& name) override;
  api::InferResponse infer(api::InferRequest&& request) override;

  /// Tests only: infer() calls it with the model name once the model is looked up, before its
  /// readiness is checked and its batcher taken (the window a racing reload must not fall into;
  /// since the two happen in one critical section, it runs under the repository's lock). Set it
  /// before any request.
  std::function<void(const std::string&)> lookup_hook_for_testing;

 private:
  /// What one request runs on: the entry and, when it was READY, its model and batcher (held
  /// until the request is answered, so a reload or unload drains it instead of failing it).
  struct Serving {
    std::shared_ptr<ModelEntry> entry;
    std::shared_ptr<LoadedModel> loaded;  ///< null when the entry was not READY
    std::shared_ptr<Batcher> batcher;
    std::string not_ready;  ///< the UNAVAILABLE message when loaded is null
  };

  std::shared_ptr<ModelEntry> find(const std::string& name, const std::string& version) const;
  /// find() and the READY check in one critical section. Throws NOT_FOUND like find().
  Serving acquire(const std::string& name, const std::string& version) const;
  api::InferResponse infer_on(Serving& serving, api::InferRequest& request);

  ServerConfig config_;
  Metrics& metrics_;
  ModelFactory factory_;
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ModelEntry>> models_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> draining_{false};
};

}  // namespace libreyolo::server
