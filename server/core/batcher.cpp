#include "server/core/batcher.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

#include "log/log.h"
#include "server/api/types.h"

namespace libreyolo::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool same_shape(const BatchJob& a, const BatchJob& b) {
  return a.pixel_values.size(2) == b.pixel_values.size(2) &&
         a.pixel_values.size(3) == b.pixel_values.size(3) &&
         a.pixel_mask.defined() == b.pixel_mask.defined();
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

void Batcher::loop() {
  const int64_t max_batch = model_->serving.max_batch_size;
  const auto delay = std::chrono::microseconds(model_->serving.max_queue_delay_microseconds);
  for (;;) {
    std::vector<std::shared_ptr<BatchJob>> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
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
      }
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
      } else {
        live.push_back(std::move(j));
      }
    }
    if (!live.empty()) run(live);
  }
}

void Batcher::run(std::vector<std::shared_ptr<BatchJob>>& batch) {
  const auto start = Clock::now();
  try {
    at::InferenceMode guard;
    std::vector<at::Tensor> pixels, masks;
    int64_t images = 0;
    for (const auto& j : batch) {
      pixels.push_back(j->pixel_values);
      if (j->pixel_mask.defined()) masks.push_back(j->pixel_mask);
      images += j->size();
    }
    auto pv =
        (pixels.size() == 1 ? pixels[0] : at::cat(pixels, 0)).to(model_->device, model_->dtype);
    at::Tensor mask;
    if (!masks.empty())
      mask = (masks.size() == 1 ? masks[0] : at::cat(masks, 0)).to(model_->device);
    const auto t_input = Clock::now();
    auto out = model_->model->forward(pv, mask);
    auto logits = out.logits.to(at::kCPU, at::kFloat);
    auto boxes = out.pred_boxes.to(at::kCPU, at::kFloat);
    const auto t_infer = Clock::now();
    const double input_s = seconds(t_input - start), infer_s = seconds(t_infer - t_input);
    int64_t offset = 0;
    double output_total = 0;
    std::vector<BatchResult> results(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& j = batch[i];
      const auto t0 = Clock::now();
      BatchResult& r = results[i];
      const int64_t n = j->size();
      auto l = logits.narrow(0, offset, n);
      auto b = boxes.narrow(0, offset, n);
      offset += n;
      r.detections =
          image::post_process_object_detection(l, b, j->target_sizes, model_->head, j->post);
      if (j->want_raw) {
        r.logits = l.contiguous();
        r.pred_boxes = b.contiguous();
      }
      r.queue_seconds = seconds(start - j->enqueued);
      r.input_seconds = input_s;
      r.infer_seconds = infer_s;
      r.batch_size = images;
      r.output_seconds = seconds(Clock::now() - t0);
      output_total += r.output_seconds;
    }
    // Statistics first, answers second: a client that reads the statistics right after its
    // answer sees its batch counted.
    if (hooks_.executed) hooks_.executed(images, input_s, infer_s, output_total);
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
