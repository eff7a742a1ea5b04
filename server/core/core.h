// The serving core: api::InferenceService over the model repository (server/repository/), the
// models' life cycle (server/lifecycle/) and the inference pipeline (server/core/infer_pipeline.h),
// with the readiness rules and the /active report. The transports (server/grpc/ gRPC, the HTTP
// port) only see api::InferenceService; the composition root is server/app/daemon. No torch in this
// header.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api/types.h"
#include "server/config/config.h"
#include "server/core/cpu_budget.h"
#include "server/metrics/metrics.h"

namespace libreyolo::models {
struct LoadOptions;
class Model;
}  // namespace libreyolo::models

namespace libreyolo::server {

class ThreadPool;
class ModelLifecycle;
class InferPipeline;

/// Loads a checkpoint folder (models::load_model in the daemon; tests inject fakes).
using ModelFactory = std::function<std::unique_ptr<models::Model>(const std::string& dir,
                                                                  const models::LoadOptions&)>;

class ServerCore : public api::InferenceService {
 public:
  /// `factory` empty: models::load_model.
  ServerCore(const ServerConfig& config, Metrics& metrics, ModelFactory factory = {});
  ~ServerCore() override;

  /// Scans model_repository (<model>/<numeric version>/; highest version served; optional
  /// <model>/serving.yaml), loads the start-up models in parallel and warms each up: every
  /// model with model_control none, those of server.load_models (--load-model; "*": all) with
  /// explicit. A model that fails is UNAVAILABLE with its reason (readiness stays false under
  /// strict_readiness); the others serve. Returns the number of models ready. Throws
  /// std::runtime_error when model_repository is not a directory ("model_repository DIR (flag
  /// --model-repository): not a directory"): the daemon then exits 1 instead of running without
  /// ever being ready.
  int load_repository();

  /// Readiness false from now on (SIGTERM); requests are still served.
  void begin_drain();
  bool draining() const { return draining_; }

  /// JSON for GET /active: kernel policy and table, fallback events, models (with their
  /// instances), and `gpu_memory` of the devices in instance_devices() (bytes).
  std::string active_json() const;

  /// The device of every instance of every loaded model ("cpu", "cuda:N"), in load order,
  /// repeats included: what /metrics and /active report GPU memory for.
  std::vector<std::string> instance_devices() const;

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
  /// readiness is checked and its instances taken (the window a racing reload must not fall into;
  /// since the two happen in one critical section, it runs under the lifecycle's lock). Set it
  /// before any request.
  std::function<void(const std::string&)> lookup_hook_for_testing;

 private:
  ServerConfig config_;
  Metrics& metrics_;
  CpuBudget cpu_;                ///< the CPUs this process may use (cgroup quota, affinity)
  std::string intra_op_source_;  ///< why the forward's intra-op thread count is what it is
  int intra_op_threads_ = 1;     ///< the process's intra-op threads (/active cpu)
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ModelLifecycle> lifecycle_;
  std::unique_ptr<InferPipeline> pipeline_;
  std::atomic<bool> draining_{false};
};

}  // namespace libreyolo::server
