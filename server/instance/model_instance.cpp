#include "server/instance/model_instance.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "kernels/out_of_memory.h"
#include "log/log.h"
#include "models/prompted.h"
#include "models/runtime/cpu_math.h"
#include "models/runtime/intra_op_threads.h"
#include "server/api/types.h"

namespace libreyolo::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// The batch input, assembled once: every job's images in one (N, 3, H, W) tensor (the model's
/// dtype on the CPU and when every image already has it on the device, the image_preprocess
/// slot's; else float32),
/// zero padded bottom/right to the largest (H, W) with a (N, H, W) int64 mask of 1 on real
/// pixels when `padded` (the image processor's `do_pad` semantics), converted to the model's
/// dtype. On CUDA it is assembled on the device: each image is copied straight into its rows
/// (asynchronously, by DMA, from the pinned host tensors the pipeline's preprocessing leaves;
/// CUDA shared-memory inputs are device tensors already) and converted there, so this thread
/// moves no image bytes itself. Staging the batch in one pinned host tensor first (a whole
/// batch's memcpy on this thread) was the served-JPEG bottleneck (docs/BENCHMARKS.md, "Served
/// JPEG").
std::pair<at::Tensor, at::Tensor> assemble(const Batch& batch, bool padded,
                                           const at::Device& device, at::ScalarType dtype) {
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
  // Pixels the image_preprocess slot wrote already have the model's dtype on its device: staged
  // in that dtype, nothing is converted (the float32 staging and its .to(dtype) pass are for
  // float32 pixels: the CPU path's, tensor inputs).
  bool in_dtype = cuda;
  for (const auto& j : batch)
    for (const auto& p : j->pixels) in_dtype = in_dtype && p.is_cuda() && p.scalar_type() == dtype;
  // On the CPU the batch is staged in the model's dtype: each image converts as it is copied,
  // one pass instead of a float32 copy and a conversion pass (3.75 ms of a 4-image bf16 batch's
  // 640x640 input before). On CUDA float32 crosses the bus and converts on the device.
  const auto options = at::TensorOptions()
                           .dtype(in_dtype || !cuda ? dtype : at::kFloat)
                           .device(cuda ? device : at::kCPU);
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

/// A failure of the device itself (out of memory, a CUDA error): the instance leaves the
/// rotation. Other exceptions fail only the batch.
bool device_failed(const std::exception& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         dynamic_cast<const c10::AcceleratorError*>(&e) != nullptr;
}

}  // namespace

ModelInstance::ModelInstance(std::size_t index, std::size_t group_size,
                             std::shared_ptr<LoadedModel> model, Scheduler& scheduler,
                             const InstanceHooks& hooks, int intra_op_threads)
    : index_(index),
      group_size_(group_size),
      intra_op_threads_(intra_op_threads),
      model_(std::move(model)),
      name_(model_->name),
      scheduler_(scheduler),
      hooks_(hooks) {
  const auto* prompted = models::prompted_detector(*model_->model);
  if (prompted && prompted->caches_text() && model_->serving.prompt_cache_mb > 0)
    prompt_cache_ = std::make_unique<PromptCache>(model_->serving.prompt_cache_mb << 20);
}

ModelInstance::~ModelInstance() { join(); }

void ModelInstance::start() {
  worker_ = std::thread([this] { loop(); });
}

void ModelInstance::join() {
  if (worker_.joinable()) worker_.join();
}

InstanceStatus ModelInstance::status() const {
  InstanceStatus st;
  st.name = name_ + "_" + std::to_string(index_);
  st.device = model_->device.str();
  st.healthy = healthy_.load();
  {
    std::lock_guard<std::mutex> lk(mu_);
    st.error = error_;
  }
  st.batches = batches_.load();
  st.images = images_.load();
  st.intra_op_threads = intra_op_threads_;
  return st;
}

void ModelInstance::loop() {
  // This instance's own CUDA stream for every copy, forward and graph replay of this thread.
  std::unique_ptr<models::StreamGuard> stream;
  try {
    stream = std::make_unique<models::StreamGuard>(model_->device);
  } catch (const std::exception& e) {
    log::warn("model '" + name_ + "': " + e.what() + "; using the current stream");
  }
  at::InferenceMode inference;
  // Before the denormal mode below, which is set on the team.
  if (intra_op_threads_ > 0) models::use_intra_op_threads(intra_op_threads_);
  // This thread's and its OpenMP team's floating-point mode, before the first forward.
  if (model_->flush_denormals) models::flush_denormals_on_this_thread();
  // On CUDA, one batch in flight on the device while the next is assembled and the previous one
  // is answered: the GPU does not wait for the host between batches. On the CPU the
  // forward has finished when launch returns, so the batch is answered at once: deferring it
  // made its answers wait for the next batch's whole forward whenever a request was queued.
  const bool overlap = model_->device.is_cuda();
  std::unique_ptr<InFlight> previous;
  Scheduler::Refill refill;  // what this instance answered right before asking for a batch
  while (healthy_) {
    Batch batch;
    // With a batch in flight (CUDA) its answers are not out yet and the forward time measured
    // for the one answered includes host work: no refill wait then. The next batch grows while
    // that forward runs instead (Refill::device_busy), and `again` comes back when it ended with
    // nothing queued: then its answers go out first. A CUDA error reading the event ends the
    // wait, and finish() meets the error.
    Scheduler::Refill ask = previous ? Scheduler::Refill{} : refill;
    if (previous) {
      ask.device_busy = [f = previous.get()] {
        try {
          return !f->done.query();
        } catch (const std::exception&) {
          return false;
        }
      };
    }
    refill = {};
    const auto next = scheduler_.next_batch(batch, ask);
    if (next == Scheduler::Next::stopped) break;
    if (next == Scheduler::Next::again) {
      // The forward in flight ended with nothing queued: answer it. `again` also comes when the
      // oldest request went elsewhere (another instance, cancel) or every one of a batch
      // expired: then, while that forward still runs and requests wait, ask again instead of
      // waiting for it here.
      if (previous && (scheduler_.pending() == 0 || !ask.device_busy()))
        refill = finish(std::move(previous));
      continue;
    }
    auto current = launch(batch);
    if (!overlap) {
      refill = finish(std::move(current));
      continue;
    }
    if (previous) finish(std::move(previous));
    previous = std::move(current);
  }
  if (previous) finish(std::move(previous));
}

void ModelInstance::take_out(Batch& batch, const std::string& what) {
  const std::string instance = name_ + "_" + std::to_string(index_);
  const std::string message = "model '" + name_ + "': instance " + instance + " on " +
                              model_->device.str() + " failed: " + what;
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    first = healthy_.exchange(false);
    if (first) error_ = what;
  }
  // Out of the rotation before the failed batch is answered: a client retrying at once must
  // reach another instance, not this one nor "no instance left".
  Batch orphans;  // every queued request when this was the last instance in rotation
  if (first) {
    const std::size_t left = scheduler_.leave_rotation(orphans);
    log::error(message + "; taken out of rotation, " + std::to_string(left) + " of " +
               std::to_string(group_size_) + " instances left");
    if (hooks_.instance_failed) hooks_.instance_failed(index_, what, left);
  }
  fail_all(batch, api::Code::internal, message);
  fail_all(orphans, api::Code::unavailable,
           "model '" + name_ + "': no instance left in rotation (every device failed)");
}

std::unique_ptr<ModelInstance::InFlight> ModelInstance::launch(Batch& batch) {
  const LoadedModel& model = *model_;
  auto f = std::make_unique<InFlight>(model.device);
  f->start = Clock::now();
  try {
    for (const auto& j : batch) f->images += j->size();
    const bool cuda = model.device.is_cuda();
    f->started.record();
    auto [pv, mask] = assemble(batch, batch.front()->padded, model.device, model.dtype);
    f->t_input = Clock::now();
    models::ModelOutput out;
    if (const auto* prompted = models::prompted_detector(*model.model)) {
      // Open-vocabulary: every image's labels, request by request (each request's TaskRequest
      // holds one list per image), tokenized for the whole batch.
      std::vector<std::vector<std::string>> labels;
      std::vector<std::string> tasks;  // OmDet-Turbo's per image; "" = the default
      for (const auto& j : batch) {
        labels.insert(labels.end(), j->request->prompts.begin(), j->request->prompts.end());
        tasks.insert(tasks.end(), j->request->tasks.begin(), j->request->tasks.end());
      }
      if (prompt_cache_) {  // each distinct piece's text forward once, then from the cache
        auto e = prompt_cache_->encode(*prompted, labels, tasks);
        f->cache_hits = e.hits;
        f->cache_misses = e.misses;
        out = prompted->forward_encoded(pv, mask, e.pieces);
      } else {
        out =
            prompted->forward_prompted_masked(pv, mask, prompted->encode_with_tasks(labels, tasks));
      }
    } else {
      out = (model.graphs && !mask.defined() && model.graphs->accepts(pv))
                ? model.graphs->run(pv)
                : model.model->forward(pv, mask);
    }
    // Outputs are float32 by the Model contract; on CUDA they land in pinned host memory
    // behind the forward, and `done` marks when they are there.
    f->logits = out.logits.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    if (model.task->uses_boxes())
      f->boxes = out.pred_boxes.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    if (model.task->uses_masks())
      f->masks = out.pred_masks.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    // Reading-order logits (PP-DocLayoutV3): the task needs them whenever the model has them.
    if (out.order_logits.defined())
      f->order = out.order_logits.to(at::kCPU, at::kFloat, /*non_blocking=*/cuda);
    f->done.record();
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + name_ + "': " + e.what());
    return nullptr;
  } catch (const kernels::OutOfMemory& e) {
    // A kernel slot's first out-of-memory in a row: transient, the client may retry; neither
    // the implementation (kernels/out_of_memory.h) nor this instance is taken out.
    fail_all(batch, api::Code::resource_exhausted, "model '" + name_ + "': " + e.what());
    return nullptr;
  } catch (const std::exception& e) {
    if (device_failed(e)) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      take_out(batch, c10_error ? c10_error->what_without_backtrace() : e.what());
      return nullptr;
    }
    log::error("model '" + name_ + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + name_ + "': " + e.what());
    return nullptr;
  }
  f->batch = std::move(batch);
  return f;
}

Scheduler::Refill ModelInstance::finish(std::unique_ptr<InFlight> f) {
  if (!f) return {};
  const LoadedModel& model = *model_;
  auto& batch = f->batch;
  try {
    f->done.synchronize();
    const auto t_infer = Clock::now();
    const double input_s = seconds(f->t_input - f->start), infer_s = seconds(t_infer - f->t_input);
    // Each request gets its rows as views of the batch's host tensors; its own thread renders
    // them (server/core/infer_pipeline.cpp). Rendering 20-odd answers here, one after another,
    // held every answer of the batch for all of them and kept this thread from the next batch.
    int64_t offset = 0;
    std::vector<BatchResult> results(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      BatchResult& r = results[i];
      const int64_t n = batch[i]->size();
      r.rows.logits = f->logits.narrow(0, offset, n);
      if (f->boxes.defined()) r.rows.pred_boxes = f->boxes.narrow(0, offset, n);
      if (f->masks.defined()) r.rows.pred_masks = f->masks.narrow(0, offset, n);
      if (f->order.defined()) r.rows.order_logits = f->order.narrow(0, offset, n);
      offset += n;
      r.queue_seconds = seconds(f->start - batch[i]->enqueued);
      r.input_seconds = input_s;
      r.infer_seconds = infer_s;
      r.batch_size = f->images;
    }
    batches_ += 1;
    images_ += static_cast<std::uint64_t>(f->images);
    // Statistics first, answers second: a client that reads the statistics right after its
    // answer sees its batch counted.
    if (hooks_.executed) {
      ExecutedBatch x;
      x.images = f->images;
      x.requests = static_cast<int64_t>(batch.size());
      x.input_seconds = input_s;
      x.infer_seconds = infer_s;
      for (const auto& r : results) x.queue_seconds += r.queue_seconds;
      if (model.device.is_cuda()) {
        try {
          x.device_seconds = f->done.seconds_since(f->started);
        } catch (const std::exception& e) {  // a statistic: never the batch's failure
          if (!device_time_warned_)
            log::warn("model '" + name_ + "': no device time of its batches: " + e.what());
          device_time_warned_ = true;
        }
      }
      x.instance = index_;
      x.prompt_cache_hits = f->cache_hits;
      x.prompt_cache_misses = f->cache_misses;
      hooks_.executed(x);
    }
    Scheduler::Refill answered;
    answered.compute = t_infer - f->t_input;
    answered.answered_requests = static_cast<int64_t>(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i)
      batch[i]->promise.set_value(std::move(results[i]));
    return answered;
  } catch (const std::invalid_argument& e) {
    fail_all(batch, api::Code::invalid_argument, "model '" + name_ + "': " + e.what());
  } catch (const std::exception& e) {
    if (device_failed(e)) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      take_out(batch, c10_error ? c10_error->what_without_backtrace() : e.what());
      return {};
    }
    log::error("model '" + name_ + "': batch failed: " + e.what());
    fail_all(batch, api::Code::internal, "model '" + name_ + "': " + e.what());
  }
  return {};
}

}  // namespace libreyolo::server
