#include "server/core/batcher.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>

#include "log/log.h"
#include "models/runtime/stream_guard.h"
#include "server/api/types.h"

namespace libreyolo::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// Requests that can share a forward: the same pixel size, or any sizes when both carry a
/// pixel_mask (padded families such as Deformable DETR: padded to the batch's largest size, as
/// transformers' processor pads a batch).
bool same_shape(const BatchJob& a, const BatchJob& b) {
  if (a.pixel_mask.defined() != b.pixel_mask.defined()) return false;
  if (a.pixel_mask.defined()) return true;
  return a.pixel_values.size(2) == b.pixel_values.size(2) &&
         a.pixel_values.size(3) == b.pixel_values.size(3);
}

/// Pads every (n, 3, h, w) tensor and its (n, h, w) mask with zeros at the bottom/right to the
/// largest (h, w) of the batch (the image processor's `do_pad` semantics).
void pad_to_largest(std::vector<at::Tensor>& pixels, std::vector<at::Tensor>& masks) {
  int64_t H = 0, W = 0;
  for (const auto& p : pixels) {
    H = std::max(H, p.size(2));
    W = std::max(W, p.size(3));
  }
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    const int64_t dh = H - pixels[i].size(2), dw = W - pixels[i].size(3);
    if (dh == 0 && dw == 0) continue;
    pixels[i] = at::constant_pad_nd(pixels[i], {0, dw, 0, dh}, 0);
    masks[i] = at::constant_pad_nd(masks[i], {0, dw, 0, dh}, 0);
  }
}

/// Fails every request of the batch not answered yet.
void fail_all(std::vector<std::shared_ptr<BatchJob>>& batch, api::Code code,
              const std::string& message) {
  for (auto& j : batch) {
    try {
      j->promise.set_exception(std::make_exception_ptr(api::Error(code, message)));
    } catch (const std::future_error&) {
      // already answered
    }
  }
}

}  // namespace

Batcher::Batcher(std::shared_ptr<LoadedModel> model, Hooks hooks)
    : model_(std::move(model)), hooks_(std::move(hooks)) {
  worker_ = std::thread([this] { loop(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

int64_t Batcher::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}

std::future<BatchResult> Batcher::submit(std::shared_ptr<BatchJob> job) {
  auto future = job->promise.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      throw api::Error(api::Code::unavailable, "model '" + model_->name + "' is shutting down");
    }
    if (queue_.size() >= model_->serving.max_queue_size) {
      throw api::Error(api::Code::resource_exhausted,
                       c10::str("model '", model_->name, "': queue full (max_queue_size ",
                                model_->serving.max_queue_size, " requests waiting)"));
    }
    job->enqueued = Clock::now();
    queue_.push_back(std::move(job));
    const auto n = static_cast<int64_t>(queue_.size());
    // Under the lock: updates from submit() and the worker must not overtake each other.
    if (hooks_.pending) hooks_.pending(n);
  }
  cv_.notify_all();
  return future;
}

bool Batcher::cancel(const std::shared_ptr<BatchJob>& job, api::Code code) {
  Clock::time_point enqueued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    enqueued = job->enqueued;
    queue_.erase(it);
    if (hooks_.pending) hooks_.pending(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_all();
  const auto waited_ms = static_cast<int64_t>(seconds(Clock::now() - enqueued) * 1000);
  job->promise.set_exception(std::make_exception_ptr(
      api::Error(code, code == api::Code::deadline_exceeded
                           ? c10::str("model '", model_->name, "': deadline exceeded after ",
                                      waited_ms, " ms in the queue")
                           : c10::str("model '", model_->name, "': cancelled by the client after ",
                                      waited_ms, " ms in the queue"))));
  return true;
}

void Batcher::loop() {
  // This model's own CUDA stream for every copy, forward and graph replay of this thread.
  std::unique_ptr<models::StreamGuard> stream;
  try {
    stream = std::make_unique<models::StreamGuard>(model_->device);
  } catch (const std::exception& e) {
    log::warn("model '" + model_->name + "': " + e.what() + "; using the current stream");
  }
  const int64_t max_batch = model_->serving.max_batch_size;
  const auto delay = std::chrono::microseconds(model_->serving.max_queue_delay_microseconds);
  at::InferenceMode inference;
  // One batch in flight on the device while the next is assembled and the previous one is
  // post-processed: the GPU does not wait for the host between batches.
  std::unique_ptr<InFlight> previous;
  for (;;) {
    if (previous && pending() == 0) finish(std::move(previous));  // nothing to overlap with
    std::vector<std::shared_ptr<BatchJob>> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping and drained
      const auto first = queue_.front();
      const auto window_end = first->enqueued + delay;
      // Let the batch grow until it is full or the oldest request has waited `delay`.
      while (!stopping_) {
        int64_t images = 0;
        for (const auto& j : queue_) {
          if (same_shape(*j, *first)) images += j->size();
        }
        if (images >= max_batch || Clock::now() >= window_end) break;
        cv_.wait_until(lk, window_end);
        // cancel() may have taken `first` out while the lock was released (a deadline or a
        // client cancellation during the window): front() of an empty queue below was undefined
        // behaviour (a stale job answered twice: "Promise already satisfied", terminate).
        if (queue_.empty() || queue_.front() != first) break;
      }
      if (queue_.empty() || queue_.front() != first) continue;  // start over from the new oldest
      int64_t images = 0;
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (same_shape(**it, *first) && images + (*it)->size() <= max_batch) {
          images += (*it)->size();
          batch.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (batch.empty()) {  // a first request larger than max_batch_size (validated earlier)
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      const auto left = static_cast<int64_t>(queue_.size());
      if (hooks_.pending) hooks_.pending(left);
    }
    // Requests whose deadline passed while queued are answered without running.
    const auto now = Clock::now();
    std::vector<std::shared_ptr<BatchJob>> live;
    for (auto& j : batch) {
      if (j->deadline && now >= *j->deadline) {
        j->promise.set_exception(std::make_exception_ptr(
            api::Error(api::Code::deadline_exceeded,
                       c10::str("model '", model_->name, "': deadline exceeded after ",
                                static_cast<int64_t>(seconds(now - j->enqueued) * 1000),
                                " ms in the queue"))));
      } else if (j->cancelled && j->cancelled()) {
        j->promise.set_exception(std::make_exception_ptr(api::Error(
            api::Code::cancelled, "model '" + model_->name + "': cancelled by the client")));
      } else {
        live.push_back(std::move(j));
      }
    }
    if (live.empty()) continue;
    auto current = launch(live);
    if (previous) finish(std::move(previous));
    previous = std::move(current);
  }
  if (previous) finish(std::move(previous));
}

std::unique_ptr<Batcher::InFlight> Batcher::launch(std::vector<std::shared_ptr<BatchJob>>& batch) {
  auto f = std::make_unique<InFlight>(model_->device);
  f->start = Clock::now();
  try {
    std::vector<at::Tensor> pixels, masks;
    for (const auto& j : batch) {
      pixels.push_back(j->pixel_values);
      if (j->pixel_mask.defined()) masks.push_back(j->pixel_mask);
      f->images += j->size();
    }
    if (!masks.empty()) pad_to_largest(pixels, masks);
    at::Tensor pv;
    const bool cuda = model_->device.is_cuda();
    // CUDA shared-memory inputs are device tensors already (server/core/image_inputs.cpp):
    // assembled on the model's device, never staged through the host.
    const bool on_device =
        std::any_of(pixels.begin(), pixels.end(), [](const at::Tensor& p) { return p.is_cuda(); });
    if (on_device) {
      for (auto& p : pixels) p = p.to(model_->device, /*non_blocking=*/true);
      pv = (pixels.size() == 1 ? pixels[0] : at::cat(pixels, 0)).to(model_->dtype);
    } else if (cuda) {
      // Staged in pinned memory (PyTorch's caching host allocator reuses the block), so the
      // host-to-device copy runs at full PCIe rate and does not block the host.
      auto first = pixels[0];
      auto staged = at::empty({f->images, first.size(1), first.size(2), first.size(3)},
                              first.options().pinned_memory(true));
      at::cat_out(staged, pixels, 0);
      pv = staged.to(model_->device, /*non_blocking=*/true).to(model_->dtype);
    } else {
      pv = (pixels.size() == 1 ? pixels[0] : at::cat(pixels, 0)).to(model_->device, model_->dtype);
    }
    at::Tensor mask;
    if (!masks.empty())
      mask = (masks.size() == 1 ? masks[0] : at::cat(masks, 0)).to(model_->device);
    f->t_input = Clock::now();
    auto out = (model_->graphs && !mask.defined() && model_->graphs->accepts(pv))
                   ? model_->graphs->run(pv)
                   : model_->model->forward(pv, mask);
    // Outputs are float32 by the Model contract; on CUDA they land in pinned host memory
    // behind the forward, and `done` marks when they are there.
    f->logits = out.logits.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    if (!model_->is_classifier())
      f->boxes = out.pred_boxes.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    f->done.record();
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + model_->name + "': " + e.what());
    return nullptr;
  } catch (const std::exception& e) {
    log::error("model '" + model_->name + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + model_->name + "': " + e.what());
    return nullptr;
  }
  f->batch = std::move(batch);
  return f;
}

void Batcher::finish(std::unique_ptr<InFlight> f) {
  if (!f) return;
  auto& batch = f->batch;
  try {
    f->done.synchronize();
    const auto t_infer = Clock::now();
    const double input_s = seconds(f->t_input - f->start), infer_s = seconds(t_infer - f->t_input);
    const bool classifier = model_->is_classifier();
    int64_t offset = 0;
    double output_total = 0;
    std::vector<BatchResult> results(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& j = batch[i];
      const auto t0 = Clock::now();
      BatchResult& r = results[i];
      const int64_t n = j->size();
      auto l = f->logits.narrow(0, offset, n);
      offset += n;
      if (classifier) {
        r.logits = l.contiguous();
        r.classifications = image::classify(r.logits, j->post.top_k);
      } else {
        auto b = f->boxes.narrow(0, offset - n, n);
        r.detections =
            image::post_process_object_detection(l, b, j->target_sizes, model_->head, j->post);
        if (j->want_raw) {
          r.logits = l.contiguous();
          r.pred_boxes = b.contiguous();
        }
      }
      r.queue_seconds = seconds(f->start - j->enqueued);
      r.input_seconds = input_s;
      r.infer_seconds = infer_s;
      r.batch_size = f->images;
      r.output_seconds = seconds(Clock::now() - t0);
      output_total += r.output_seconds;
    }
    // Statistics first, answers second: a client that reads the statistics right after its
    // answer sees its batch counted.
    if (hooks_.executed) hooks_.executed(f->images, input_s, infer_s, output_total);
    for (std::size_t i = 0; i < batch.size(); ++i)
      batch[i]->promise.set_value(std::move(results[i]));
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + model_->name + "': " + e.what());
  } catch (const std::exception& e) {
    log::error("model '" + model_->name + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + model_->name + "': " + e.what());
  }
}

}  // namespace libreyolo::server
