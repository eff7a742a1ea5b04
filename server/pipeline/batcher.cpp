#include "server/pipeline/batcher.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>

#include "log/log.h"
#include "models/runtime/stream_guard.h"
#include "server/api/types.h"

namespace libreyolo::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// Requests that can share a forward: any sizes when the processor pads (padded families such
/// as Deformable DETR: padded to the batch's largest size, as transformers' processor pads a
/// batch), else the same pixel size.
bool same_shape(const BatchJob& a, const BatchJob& b) {
  if (a.padded != b.padded) return false;
  if (a.padded) return true;
  const auto& x = a.pixels.front();
  const auto& y = b.pixels.front();
  return x.size(2) == y.size(2) && x.size(3) == y.size(3);
}

/// The batch input, assembled once: every job's images in one (N, 3, H, W) float32 tensor,
/// zero padded bottom/right to the largest (H, W) with a (N, H, W) int64 mask of 1 on real
/// pixels when `padded` (the image processor's `do_pad` semantics), converted to the model's
/// dtype. On CUDA it is assembled on the device: each image is copied straight into its rows
/// (asynchronously, by DMA, from the pinned host tensors the pipeline's preprocessing leaves;
/// CUDA shared-memory inputs are device tensors already) and converted there, so this thread
/// moves no image bytes itself. Staging the batch in one pinned host tensor first cost a
/// 157 MB memcpy per batch of 32 at 640x640 on this thread, the served-JPEG bottleneck of
/// docs/BENCHMARKS.md.
std::pair<at::Tensor, at::Tensor> assemble(const std::vector<std::shared_ptr<BatchJob>>& batch,
                                           bool padded, const at::Device& device,
                                           at::ScalarType dtype) {
  int64_t n = 0, H = 0, W = 0;
  for (const auto& j : batch)
    for (const auto& p : j->pixels) {
      n += p.size(0);
      H = std::max(H, p.size(2));
      W = std::max(W, p.size(3));
    }
  const bool cuda = device.is_cuda();
  if (!padded && !cuda && batch.size() == 1 && batch[0]->pixels.size() == 1)
    return {batch[0]->pixels[0].to(device, dtype), at::Tensor()};  // nothing to stack
  const auto options = at::TensorOptions().dtype(at::kFloat).device(cuda ? device : at::kCPU);
  at::Tensor staged = padded ? at::zeros({n, 3, H, W}, options) : at::empty({n, 3, H, W}, options);
  at::Tensor mask;
  if (padded) mask = at::zeros({n, H, W}, options.dtype(at::kLong));
  int64_t row = 0;
  for (const auto& j : batch)
    for (const auto& p : j->pixels) {
      const int64_t k = p.size(0), h = p.size(2), w = p.size(3);
      // From pageable host memory (tensor inputs) cudaMemcpyAsync returns once the driver has
      // staged the bytes, so the source may go right after; pinned sources are kept by the
      // caching host allocator until the copy's stream passes it.
      staged.narrow(0, row, k).narrow(2, 0, h).narrow(3, 0, w).copy_(p, /*non_blocking=*/cuda);
      if (padded) mask.narrow(0, row, k).narrow(1, 0, h).narrow(2, 0, w).fill_(1);
      row += k;
    }
  return {staged.to(device, dtype), mask};
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

Batcher::Batcher(std::vector<std::shared_ptr<LoadedModel>> instances, Hooks hooks)
    : name_(instances.at(0)->name), serving_(instances.at(0)->serving), hooks_(std::move(hooks)) {
  for (std::size_t i = 0; i < instances.size(); ++i) {
    auto inst = std::make_unique<Instance>();
    inst->index = i;
    inst->model = std::move(instances[i]);
    instances_.push_back(std::move(inst));
  }
  for (auto& inst : instances_) inst->worker = std::thread([this, p = inst.get()] { loop(*p); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& inst : instances_) inst->worker.join();
  // Instances all taken out of rotation left nobody to drain the queue: answer it.
  std::deque<std::shared_ptr<BatchJob>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(queue_);
  }
  for (auto& j : left) {
    try {
      j->promise.set_exception(std::make_exception_ptr(
          api::Error(api::Code::unavailable, "model '" + name_ + "' is shutting down")));
    } catch (const std::future_error&) {
    }
  }
}

int64_t Batcher::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}

std::size_t Batcher::healthy_instances() const {
  std::size_t n = 0;
  for (const auto& inst : instances_) n += inst->healthy.load();
  return n;
}

std::vector<InstanceStatus> Batcher::instances() const {
  std::vector<InstanceStatus> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& inst : instances_) {
    InstanceStatus st;
    st.name = name_ + "_" + std::to_string(inst->index);
    st.device = inst->model->device.str();
    st.healthy = inst->healthy.load();
    st.error = inst->error;
    st.batches = inst->batches.load();
    st.images = inst->images.load();
    out.push_back(std::move(st));
  }
  return out;
}

std::future<BatchResult> Batcher::submit(std::shared_ptr<BatchJob> job) {
  auto future = job->promise.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      throw api::Error(api::Code::unavailable, "model '" + name_ + "' is shutting down");
    }
    if (healthy_instances() == 0) {
      throw api::Error(api::Code::unavailable,
                       "model '" + name_ + "': no instance left in rotation (every device failed)");
    }
    if (queue_.size() >= serving_.max_queue_size) {
      throw api::Error(api::Code::resource_exhausted,
                       c10::str("model '", name_, "': queue full (max_queue_size ",
                                serving_.max_queue_size, " requests waiting)"));
    }
    job->enqueued = Clock::now();
    queue_.push_back(std::move(job));
    const auto n = static_cast<int64_t>(queue_.size());
    // Under the lock: updates from submit() and the workers must not overtake each other.
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
  job->promise.set_exception(std::make_exception_ptr(api::Error(
      code,
      code == api::Code::deadline_exceeded
          ? c10::str("model '", name_, "': deadline exceeded after ", waited_ms, " ms in the queue")
          : c10::str("model '", name_, "': cancelled by the client after ", waited_ms,
                     " ms in the queue"))));
  return true;
}

void Batcher::loop(Instance& inst) {
  const LoadedModel& model = *inst.model;
  // This instance's own CUDA stream for every copy, forward and graph replay of this thread.
  std::unique_ptr<models::StreamGuard> stream;
  try {
    stream = std::make_unique<models::StreamGuard>(model.device);
  } catch (const std::exception& e) {
    log::warn("model '" + name_ + "': " + e.what() + "; using the current stream");
  }
  const int64_t max_batch = serving_.max_batch_size;
  const auto delay = std::chrono::microseconds(serving_.max_queue_delay_microseconds);
  at::InferenceMode inference;
  // One batch in flight on the device while the next is assembled and the previous one is
  // post-processed: the GPU does not wait for the host between batches.
  std::unique_ptr<InFlight> previous;
  while (inst.healthy) {
    if (previous && pending() == 0) finish(inst, std::move(previous));  // nothing to overlap
    if (!inst.healthy) break;
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
        // cancel() or another instance may have taken `first` out while the lock was released
        // (front() of an empty queue below was undefined behaviour: a stale job answered twice,
        // "Promise already satisfied", terminate).
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
    // The others may take what this batch left behind.
    cv_.notify_all();
    // Requests whose deadline passed while queued are answered without running.
    const auto now = Clock::now();
    std::vector<std::shared_ptr<BatchJob>> live;
    for (auto& j : batch) {
      if (j->deadline && now >= *j->deadline) {
        j->promise.set_exception(std::make_exception_ptr(
            api::Error(api::Code::deadline_exceeded,
                       c10::str("model '", name_, "': deadline exceeded after ",
                                static_cast<int64_t>(seconds(now - j->enqueued) * 1000),
                                " ms in the queue"))));
      } else if (j->cancelled && j->cancelled()) {
        j->promise.set_exception(std::make_exception_ptr(
            api::Error(api::Code::cancelled, "model '" + name_ + "': cancelled by the client")));
      } else {
        live.push_back(std::move(j));
      }
    }
    if (live.empty()) continue;
    auto current = launch(inst, live);
    if (previous) finish(inst, std::move(previous));
    previous = std::move(current);
  }
  if (previous) finish(inst, std::move(previous));
}

namespace {

/// A failure of the device itself (out of memory, a CUDA error): the instance leaves the
/// rotation. Other exceptions fail only the batch.
bool device_failed(const std::exception& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         dynamic_cast<const c10::AcceleratorError*>(&e) != nullptr;
}

}  // namespace

void Batcher::take_out(Instance& inst, std::vector<std::shared_ptr<BatchJob>>& batch,
                       const std::string& what) {
  const std::string instance = name_ + "_" + std::to_string(inst.index);
  const std::string message = "model '" + name_ + "': instance " + instance + " on " +
                              inst.model->device.str() + " failed: " + what;
  fail_all(batch, api::Code::internal, message);
  std::deque<std::shared_ptr<BatchJob>> orphans;
  std::size_t left = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!inst.healthy.exchange(false)) return;
    inst.error = what;
    left = healthy_instances();
    if (left == 0) orphans.swap(queue_);
  }
  log::error(message + "; taken out of rotation, " + std::to_string(left) + " of " +
             std::to_string(instances_.size()) + " instances left");
  if (hooks_.instance_failed) hooks_.instance_failed(inst.index, what, left);
  for (auto& j : orphans) {
    try {
      j->promise.set_exception(std::make_exception_ptr(
          api::Error(api::Code::unavailable,
                     "model '" + name_ + "': no instance left in rotation (every device failed)")));
    } catch (const std::future_error&) {
    }
  }
  if (!orphans.empty() && hooks_.pending) hooks_.pending(0);
}

std::unique_ptr<Batcher::InFlight> Batcher::launch(Instance& inst,
                                                   std::vector<std::shared_ptr<BatchJob>>& batch) {
  const LoadedModel& model = *inst.model;
  auto f = std::make_unique<InFlight>(model.device);
  f->start = Clock::now();
  try {
    for (const auto& j : batch) f->images += j->size();
    const bool cuda = model.device.is_cuda();
    auto [pv, mask] = assemble(batch, batch.front()->padded, model.device, model.dtype);
    f->t_input = Clock::now();
    auto out = (model.graphs && !mask.defined() && model.graphs->accepts(pv))
                   ? model.graphs->run(pv)
                   : model.model->forward(pv, mask);
    // Outputs are float32 by the Model contract; on CUDA they land in pinned host memory
    // behind the forward, and `done` marks when they are there.
    f->logits = out.logits.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    if (model.task->uses_boxes())
      f->boxes = out.pred_boxes.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    if (model.task->uses_masks())
      f->masks = out.pred_masks.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    f->done.record();
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + name_ + "': " + e.what());
    return nullptr;
  } catch (const std::exception& e) {
    if (device_failed(e)) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      take_out(inst, batch, c10_error ? c10_error->what_without_backtrace() : e.what());
      return nullptr;
    }
    log::error("model '" + name_ + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + name_ + "': " + e.what());
    return nullptr;
  }
  f->batch = std::move(batch);
  return f;
}

void Batcher::finish(Instance& inst, std::unique_ptr<InFlight> f) {
  if (!f) return;
  const LoadedModel& model = *inst.model;
  auto& batch = f->batch;
  try {
    f->done.synchronize();
    const auto t_infer = Clock::now();
    const double input_s = seconds(f->t_input - f->start), infer_s = seconds(t_infer - f->t_input);
    int64_t offset = 0;
    double output_total = 0;
    std::vector<BatchResult> results(batch.size());
    std::vector<std::exception_ptr> errors(batch.size());  // a request's own api::Error
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& j = batch[i];
      const auto t0 = Clock::now();
      BatchResult& r = results[i];
      const int64_t n = j->size();
      models::ModelOutput rows;
      rows.logits = f->logits.narrow(0, offset, n);
      if (f->boxes.defined()) rows.pred_boxes = f->boxes.narrow(0, offset, n);
      if (f->masks.defined()) rows.pred_masks = f->masks.narrow(0, offset, n);
      offset += n;
      try {
        r.outputs = model.task->respond(rows, *j->request);
      } catch (const api::Error&) {
        errors[i] = std::current_exception();
      }
      r.queue_seconds = seconds(f->start - j->enqueued);
      r.input_seconds = input_s;
      r.infer_seconds = infer_s;
      r.batch_size = f->images;
      r.output_seconds = seconds(Clock::now() - t0);
      output_total += r.output_seconds;
    }
    inst.batches += 1;
    inst.images += static_cast<std::uint64_t>(f->images);
    // Statistics first, answers second: a client that reads the statistics right after its
    // answer sees its batch counted.
    if (hooks_.executed) {
      Executed x;
      x.images = f->images;
      x.requests = static_cast<int64_t>(batch.size());
      x.input_seconds = input_s;
      x.infer_seconds = infer_s;
      x.output_seconds = output_total;
      for (const auto& r : results) x.queue_seconds += r.queue_seconds;
      x.instance = inst.index;
      hooks_.executed(x);
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (errors[i]) {
        batch[i]->promise.set_exception(errors[i]);
      } else {
        batch[i]->promise.set_value(std::move(results[i]));
      }
    }
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + name_ + "': " + e.what());
  } catch (const std::exception& e) {
    if (device_failed(e)) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      take_out(inst, batch, c10_error ? c10_error->what_without_backtrace() : e.what());
      return;
    }
    log::error("model '" + name_ + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + name_ + "': " + e.what());
  }
}

}  // namespace libreyolo::server
