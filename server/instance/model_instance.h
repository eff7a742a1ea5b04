// One model instance (Triton's backend_model_instance; instance_group gives a model several):
// its own weights on its device, its CUDA stream and graphs, and one worker thread that takes
// formed batches from the model's Scheduler (server/scheduler/scheduler.h), assembles each once
// (padded to the largest image and converted to the model's dtype in one pass), runs one forward
// and hands each request its rows of the output (the request's own thread post-processes them:
// server/core/infer_pipeline.cpp). On CUDA one batch stays in flight on the instance's stream
// while the worker assembles the next and answers the previous one, so the GPU does not wait for
// the host between batches.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "models/runtime/stream_guard.h"
#include "server/instance/loaded_model.h"
#include "server/instance/prompt_cache.h"
#include "server/metrics/statistics.h"
#include "server/scheduler/batch_job.h"
#include "server/scheduler/scheduler.h"

namespace libreyolo::server {

/// What /active reports of one instance.
struct InstanceStatus {
  std::string name;           ///< "<model>_<i>" (Triton names instances after their model)
  std::string device;         ///< "cpu", "cuda:0", ...
  bool healthy = true;        ///< in rotation
  std::string error;          ///< why it was taken out ("" when healthy)
  std::uint64_t batches = 0;  ///< forwards run
  std::uint64_t images = 0;   ///< images inferred
  /// CPU: the ATen intra-op threads of this instance's forwards (the process's count shared
  /// among the model's CPU instances: ModelInstances); 0 on other devices.
  int intra_op_threads = 0;
};

/// One executed batch as the hooks see it (seconds).
struct ExecutedBatch {
  int64_t images = 0;        ///< rows of the forward
  int64_t requests = 0;      ///< requests in the batch
  double input_seconds = 0;  ///< assembly + copy to device
  double infer_seconds = 0;  ///< forward (until the instance read its end)
  double queue_seconds = 0;  ///< sum over the requests of enqueue -> batch start
  /// CUDA: the batch's time on the instance's stream, from the stream reaching its input copies
  /// to its outputs copied to the host (CUDA events; behind a forward in flight it starts when
  /// that one ends), so that its sum over a window against the wall time shows the gaps between
  /// batches. The span includes the stream's stalls while an eager forward waits for the host's
  /// launches, and another instance's work on the same GPU: not the GPU's utilisation. Negative
  /// on the CPU, and when the events could not be read.
  double device_seconds = -1;
  std::size_t instance = 0;  ///< the instance that ran it (instance_group order)
  /// Open-vocabulary models with a prompt cache: the batch's distinct pieces (OWL: labels,
  /// Grounding DINO: captions) found / encoded.
  int64_t prompt_cache_hits = 0, prompt_cache_misses = 0;
};

/// Called from an instance's worker after each executed batch, and once when the instance is
/// taken out of rotation, with the error and the instances left.
struct InstanceHooks {
  std::function<void(const ExecutedBatch&)> executed;
  std::function<void(std::size_t, const std::string&, std::size_t)> instance_failed;
};

class ModelInstance {
 public:
  /// Instance `index` of `group_size` (instance_group order) running `model`, fed by
  /// `scheduler`; both and `hooks` must outlive it. The worker starts with start().
  /// `intra_op_threads` (CPU instances; 0 elsewhere): the ATen intra-op threads of this
  /// instance's forwards, set on its worker thread (models::use_intra_op_threads) before the
  /// first; ModelInstances gives each CPU instance its share of the process's count.
  ModelInstance(std::size_t index, std::size_t group_size, std::shared_ptr<LoadedModel> model,
                Scheduler& scheduler, const InstanceHooks& hooks, int intra_op_threads = 0);
  /// Joins the worker (join()).
  ~ModelInstance();
  ModelInstance(const ModelInstance&) = delete;
  ModelInstance& operator=(const ModelInstance&) = delete;

  /// Starts the worker thread.
  void start();
  /// Waits for the worker: it ends when the scheduler stopped and drained, or when the instance
  /// left the rotation.
  void join();

  /// In rotation (its device has not failed).
  bool healthy() const { return healthy_; }

  /// What /active reports.
  InstanceStatus status() const;

 private:
  /// A batch whose forward is enqueued on the instance's stream, outputs copying to host behind
  /// it.
  struct InFlight {
    explicit InFlight(const at::Device& device)
        : started(device, /*timed=*/true), done(device, /*timed=*/true) {}
    Batch batch;
    at::Tensor logits, boxes, masks;  ///< host float32 (boxes, masks when the task uses them)
    at::Tensor order;  ///< host float32 order_logits (document-layout models), else undefined
    /// On the instance's stream before the batch's input copies, and after its output copies:
    /// the device time between them is ExecutedBatch::device_seconds.
    models::StreamEvent started;
    models::StreamEvent done;
    int64_t images = 0;
    int64_t cache_hits = 0, cache_misses = 0;  ///< the prompt cache's, for ExecutedBatch
    Clock::time_point start, t_input;
  };

  void loop();
  /// Assembles the batch and enqueues its forward; answers it with the error when that fails
  /// (returns null then).
  std::unique_ptr<InFlight> launch(Batch& batch);
  /// Waits for the outputs and answers every request of the batch with its rows (BatchResult).
  /// Returns the requests answered and their forward's time (the scheduler's refill wait); {}
  /// when it failed.
  Scheduler::Refill finish(std::unique_ptr<InFlight> f);
  /// Answers `batch` INTERNAL and takes the instance out of rotation (its device failed: CUDA
  /// error, out of memory); the last one out answers every queued request UNAVAILABLE.
  void take_out(Batch& batch, const std::string& what);

  const std::size_t index_, group_size_;
  const int intra_op_threads_;  ///< InstanceStatus::intra_op_threads
  const std::shared_ptr<LoadedModel> model_;
  const std::string name_;  ///< the model's name
  Scheduler& scheduler_;
  const InstanceHooks& hooks_;
  std::thread worker_;
  std::atomic<bool> healthy_{true};
  std::atomic<std::uint64_t> batches_{0}, images_{0};
  /// The text-encoding cache (serving.yaml prompt_cache_mb) of a model whose family caches its
  /// text (PromptedDetector::caches_text); null otherwise. The worker's alone.
  std::unique_ptr<PromptCache> prompt_cache_;
  bool device_time_warned_ = false;  ///< the worker's alone: a failed device-time read logged
  mutable std::mutex mu_;
  std::string error_;  ///< guarded by mu_
};

}  // namespace libreyolo::server
