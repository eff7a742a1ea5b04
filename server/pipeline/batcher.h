// Per-model dynamic batching (Triton's dynamic batcher semantics): requests queue; one worker
// thread per model takes the oldest request, waits up to max_queue_delay_microseconds for more
// requests of the same pixel size (any size for padded families: padded to the largest, with
// pixel_mask) until max_batch_size images, assembles the batch once (padded to the largest
// image and converted to the model's dtype in one pass), drops requests whose deadline
// passed while queued (DEADLINE_EXCEEDED, never run), runs one forward and post-processes.
// On CUDA one batch stays in flight on the model's stream while the worker assembles the next
// and post-processes the previous one, so the GPU does not wait for the host between batches.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/runtime/stream_guard.h"
#include "server/api/types.h"
#include "server/core/statistics.h"
#include "server/lifecycle/loaded_model.h"
#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

struct BatchResult {
  /// The request's output tensors (the model's TaskAdapter::respond).
  std::vector<api::OutputTensor> outputs;
  double queue_seconds = 0;   ///< enqueue -> batch start
  double input_seconds = 0;   ///< batch assembly + copy to device (the whole batch)
  double infer_seconds = 0;   ///< forward (the whole batch)
  double output_seconds = 0;  ///< post-processing of this request
  int64_t batch_size = 0;     ///< images in the forward this request ran in
};

/// What one request hands to the batcher.
struct BatchJob {
  /// The request's images, unpadded: (1, 3, h, w) float32 CPU per encoded image (processor
  /// output), or the request's `pixel_values` (n, 3, H, W) as one tensor. The batcher pads and
  /// converts them once, into the batch.
  std::vector<at::Tensor> pixels;
  /// The processor pads (do_pad): requests of any size share a batch, padded bottom/right to
  /// the largest with a pixel_mask. Otherwise every image of the job has one size.
  bool padded = false;
  /// What the task adapter's respond() needs (target sizes, post-processing, outputs).
  std::shared_ptr<const TaskRequest> request;
  std::optional<Clock::time_point> deadline;
  /// True once the call is cancelled (api::InferRequest::cancelled); such a job never runs.
  std::function<bool()> cancelled;
  Clock::time_point enqueued;
  std::promise<BatchResult> promise;
  /// Images of the job (the batch rows it takes).
  int64_t size() const {
    int64_t n = 0;
    for (const auto& p : pixels) n += p.size(0);
    return n;
  }
};

/// What /active reports of one instance.
struct InstanceStatus {
  std::string name;           ///< "<model>_<i>" (Triton names instances after their model)
  std::string device;         ///< "cpu", "cuda:0", ...
  bool healthy = true;        ///< in rotation
  std::string error;          ///< why it was taken out ("" when healthy)
  std::uint64_t batches = 0;  ///< forwards run
  std::uint64_t images = 0;   ///< images inferred
};

class Batcher {
 public:
  /// One executed batch as the hooks see it (seconds).
  struct Executed {
    int64_t images = 0;         ///< rows of the forward
    int64_t requests = 0;       ///< requests in the batch
    double input_seconds = 0;   ///< assembly + copy to device
    double infer_seconds = 0;   ///< forward
    double output_seconds = 0;  ///< post-processing of every request
    double queue_seconds = 0;   ///< sum over the requests of enqueue -> batch start
    std::size_t instance = 0;   ///< the instance that ran it (instance_group order)
  };
  /// Called (from a worker thread) with the queue length after each change; after each
  /// executed batch; and once when an instance is taken out of rotation, with the error and
  /// the instances left.
  struct Hooks {
    std::function<void(int64_t)> pending;
    std::function<void(const Executed&)> executed;
    std::function<void(std::size_t, const std::string&, std::size_t)> instance_failed;
  };

  /// One worker per instance (Triton's instance_group: each with its own weights, device,
  /// stream and CUDA graphs); they take batches from one queue, so a batch goes to an instance
  /// that is free. `instances` is not empty; instances[0] names the model and its settings.
  Batcher(std::vector<std::shared_ptr<LoadedModel>> instances, Hooks hooks);
  /// Finishes every queued request, then joins the workers.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// Queues a request. Throws api::Error RESOURCE_EXHAUSTED when max_queue_size requests wait,
  /// UNAVAILABLE when shutting down or when no instance is left in rotation.
  std::future<BatchResult> submit(std::shared_ptr<BatchJob> job);

  /// Takes `job` out of the queue when it still waits and answers it `code` (CANCELLED, or
  /// DEADLINE_EXCEEDED when its deadline passed): the slot is free at once. False when the job
  /// already runs or was answered.
  bool cancel(const std::shared_ptr<BatchJob>& job, api::Code code);

  /// Requests waiting (not running).
  int64_t pending() const;

  /// Instances in rotation.
  std::size_t healthy_instances() const;

  /// Every instance, in instance_group order.
  std::vector<InstanceStatus> instances() const;

 private:
  /// A batch whose forward is enqueued on the instance's stream, outputs copying to host behind
  /// it.
  struct InFlight {
    explicit InFlight(const at::Device& device) : done(device) {}
    std::vector<std::shared_ptr<BatchJob>> batch;
    at::Tensor logits, boxes, masks;  ///< host float32 (boxes, masks when the task uses them)
    models::StreamEvent done;
    int64_t images = 0;
    Clock::time_point start, t_input;
  };
  struct Instance {
    std::size_t index = 0;
    std::shared_ptr<LoadedModel> model;
    std::thread worker;
    std::atomic<bool> healthy{true};
    std::atomic<std::uint64_t> batches{0}, images{0};
    std::string error;  ///< guarded by Batcher::mu_
  };

  void loop(Instance& instance);
  /// Assembles the batch and enqueues its forward; answers it with the error when that fails
  /// (returns null then).
  std::unique_ptr<InFlight> launch(Instance& instance,
                                   std::vector<std::shared_ptr<BatchJob>>& batch);
  /// Waits for the outputs, post-processes and answers every request of the batch.
  void finish(Instance& instance, std::unique_ptr<InFlight> f);
  /// Answers `batch` INTERNAL and takes `instance` out of rotation (its device failed: CUDA
  /// error, out of memory); the last one out answers every queued request UNAVAILABLE.
  void take_out(Instance& instance, std::vector<std::shared_ptr<BatchJob>>& batch,
                const std::string& what);

  const std::string name_;
  const ServingConfig serving_;
  Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<BatchJob>> queue_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Instance>> instances_;
};

}  // namespace libreyolo::server
