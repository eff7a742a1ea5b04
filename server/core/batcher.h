// Per-model dynamic batching (Triton's dynamic batcher semantics): requests queue; one worker
// thread per model takes the oldest request, waits up to max_queue_delay_microseconds for more
// requests of the same pixel size (any size for padded families: padded to the largest, with
// pixel_mask) until max_batch_size images, drops requests whose deadline
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
#include <thread>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"
#include "models/runtime/stream_guard.h"
#include "server/api/types.h"
#include "server/core/loaded_model.h"

namespace libreyolo::server {

using Clock = std::chrono::steady_clock;

struct BatchResult {
  std::vector<image::Detections> detections;  ///< per image, CPU (detectors)
  /// Detectors: (n, Q, C) / (n, Q, 4) CPU float32 when want_raw. Classifiers: logits (n, C) CPU
  /// float32 always, pred_boxes undefined.
  at::Tensor logits, pred_boxes;
  image::Classifications classifications;  ///< classifiers: softmax + top post.top_k, CPU
  double queue_seconds = 0;                ///< enqueue -> batch start
  double input_seconds = 0;                ///< batch assembly + copy to device (the whole batch)
  double infer_seconds = 0;                ///< forward (the whole batch)
  double output_seconds = 0;               ///< post-processing of this request
  int64_t batch_size = 0;                  ///< images in the forward this request ran in
};

/// What one request hands to the batcher.
struct BatchJob {
  at::Tensor pixel_values;                                ///< (n, 3, H, W) float32, CPU
  at::Tensor pixel_mask;                                  ///< (n, H, W) int64, or undefined
  std::vector<std::pair<int64_t, int64_t>> target_sizes;  ///< n (height, width), pixels
  image::PostProcessOptions post;                         ///< classifiers use only top_k (0: 5)
  bool want_raw = false;                                  ///< keep logits / pred_boxes (detectors)
  std::optional<Clock::time_point> deadline;
  /// True once the call is cancelled (api::InferRequest::cancelled); such a job never runs.
  std::function<bool()> cancelled;
  Clock::time_point enqueued;
  std::promise<BatchResult> promise;
  int64_t size() const { return pixel_values.size(0); }
};

class Batcher {
 public:
  /// Called (from the worker thread) with the queue length after each change, and after each
  /// executed batch with its size and input/infer/output seconds.
  struct Hooks {
    std::function<void(int64_t)> pending;
    std::function<void(int64_t, double, double, double)> executed;
  };

  Batcher(std::shared_ptr<LoadedModel> model, Hooks hooks);
  /// Finishes every queued request, then joins the worker.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// Queues a request. Throws api::Error RESOURCE_EXHAUSTED when max_queue_size requests wait.
  std::future<BatchResult> submit(std::shared_ptr<BatchJob> job);

  /// Takes `job` out of the queue when it still waits and answers it `code` (CANCELLED, or
  /// DEADLINE_EXCEEDED when its deadline passed): the slot is free at once. False when the job
  /// already runs or was answered.
  bool cancel(const std::shared_ptr<BatchJob>& job, api::Code code);

  /// Requests waiting (not running).
  int64_t pending() const;

 private:
  /// A batch whose forward is enqueued on the model's stream, outputs copying to host behind it.
  struct InFlight {
    explicit InFlight(const at::Device& device) : done(device) {}
    std::vector<std::shared_ptr<BatchJob>> batch;
    at::Tensor logits, boxes;  ///< host float32; valid after done.synchronize()
    models::StreamEvent done;
    int64_t images = 0;
    Clock::time_point start, t_input;
  };

  void loop();
  /// Assembles the batch and enqueues its forward; answers it with the error when that fails
  /// (returns null then).
  std::unique_ptr<InFlight> launch(std::vector<std::shared_ptr<BatchJob>>& batch);
  /// Waits for the outputs, post-processes and answers every request of the batch.
  void finish(std::unique_ptr<InFlight> f);

  std::shared_ptr<LoadedModel> model_;
  Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<BatchJob>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace libreyolo::server
