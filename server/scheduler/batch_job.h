// What a request hands to its model's scheduler, and what it gets back: the queue's item, shared
// by every Scheduler (scheduler.h) and the instances that run the batches it forms.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/api/types.h"
#include "server/metrics/statistics.h"
#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

/// One request's rows of the forward it ran in, and that batch's timings. The request's own
/// thread post-processes the rows (TaskAdapter::respond): answers of one batch are rendered in
/// parallel, and the instance goes back to its next batch at once.
struct BatchResult {
  /// The request's rows of the batch output: host float32 views (n, ...) of the whole batch's
  /// tensors, n = the request's images (logits always; pred_boxes, pred_masks, order_logits
  /// where the task reads them). On the CPU they may be the model's own output tensors (no
  /// copy): read-only, and Model::forward returns fresh tensors per call.
  models::ModelOutput rows;
  double queue_seconds = 0;  ///< enqueue -> batch start
  double input_seconds = 0;  ///< batch assembly + copy to device (the whole batch)
  double infer_seconds = 0;  ///< forward (the whole batch)
  int64_t batch_size = 0;    ///< images in the forward this request ran in
};

/// What one request hands to the scheduler.
struct BatchJob {
  /// The request's images, unpadded: (1, 3, h, w) float32 CPU per encoded image (processor
  /// output), or the request's `pixel_values` (n, 3, H, W) as one tensor. The instance pads and
  /// converts them once, into the batch.
  std::vector<at::Tensor> pixels;
  /// The processor pads (do_pad): the batch is zero padded bottom/right to its largest image,
  /// with a pixel_mask. Otherwise every image of the job has one size.
  bool padded = false;
  /// `padded` and the model's family reads pixel_mask (models::Family::pixel_mask): requests of
  /// any size share a batch. Otherwise a request shares one only with requests of its extent(),
  /// so that padding never enters a forward the request would not have run alone.
  bool any_size = false;
  /// What the task adapter's respond() needs (target sizes, post-processing, outputs).
  std::shared_ptr<const TaskRequest> request;
  std::optional<Clock::time_point> deadline;
  /// True once the call is cancelled (api::InferRequest::cancelled); such a job never runs.
  std::function<bool()> cancelled;
  Clock::time_point enqueued;
  std::promise<BatchResult> promise;
  /// (H, W) of the job's largest image: what it pads to alone (every image's size when not
  /// `padded`). Throws std::out_of_range for a job without pixels.
  std::pair<int64_t, int64_t> extent() const {
    if (pixels.empty()) throw std::out_of_range("BatchJob::extent: a job without pixels");
    int64_t h = 0, w = 0;
    for (const auto& p : pixels) {
      h = std::max(h, p.size(2));
      w = std::max(w, p.size(3));
    }
    return {h, w};
  }
  /// Images of the job (the batch rows it takes).
  int64_t size() const {
    int64_t n = 0;
    for (const auto& p : pixels) n += p.size(0);
    return n;
  }
};

/// The requests of one forward, oldest first.
using Batch = std::vector<std::shared_ptr<BatchJob>>;

/// Answers every request of `batch` not answered yet with api::Error(code, message).
void fail_all(Batch& batch, api::Code code, const std::string& message);

}  // namespace libreyolo::server
