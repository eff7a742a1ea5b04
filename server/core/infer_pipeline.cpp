#include "server/core/infer_pipeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <future>
#include <optional>
#include <tuple>

#include "kernels/out_of_memory.h"
#include "log/log.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"
#include "models/image/preprocess_slot.h"
#include "models/registry/family.h"
#include "models/runtime/stream_guard.h"
#include "server/instance/model_instances.h"
#include "server/metrics/statistics.h"
#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

using api::Code;
using api::Error;

namespace {

/// Decodes and preprocesses every encoded image of `req` on `pool`, one task per image. Fills
/// `pixels` (one (1, 3, h, w) float32 tensor per image, unpadded: the instance pads once) and,
/// when the request gave no target_sizes, the original sizes. Throws INVALID_ARGUMENT naming
/// the image for an undecodable or unprocessable image; CANCELLED / DEADLINE_EXCEEDED when the
/// call ended before an image's turn came (a task then skips its image: the pool serves other
/// calls instead of decoding for a client that left).
void preprocess(ThreadPool& pool, const LoadedModel& m, int64_t max_pixels, TaskRequest& req,
                const api::InferRequest& call, std::vector<at::Tensor>& pixels) {
  std::vector<std::future<image::ProcessorOutput>> futures;
  const auto token = call.cancel;
  const auto deadline = call.deadline;
  auto check_call = [token, deadline] {
    if (token && token->cancelled())
      throw Error(token->reason() == Code::ok ? Code::cancelled : token->reason(),
                  "the call ended before its images were decoded");
    if (deadline && Clock::now() >= *deadline)
      throw Error(Code::deadline_exceeded, "deadline exceeded before the images were decoded");
  };
  image::DecodeOptions options;
  options.max_pixels = max_pixels;
  // server.gpu_image_decode with several images: the `image_decode_batch` slot decodes them in
  // one call here (nvJPEG's engines in parallel), on a stream of PyTorch's pool; it waits for
  // its decode, so the tasks below read finished pixels on their own streams. What it declines
  // reaches image_decode inside decode_images, as a single image does in its task.
  std::vector<kernels::DecodedImage> decoded;
  if (req.images.size() > 1 && !m.image_decode_batch.empty()) {
    check_call();
    std::vector<kernels::EncodedImage> encoded;
    for (const auto& im : req.images)
      encoded.push_back({reinterpret_cast<const std::uint8_t*>(im.data()), im.size()});
    const models::StreamGuard stream(m.device);
    decoded = image::decode_images(m.image_decode_batch, m.image_decode, encoded, options,
                                   m.device.index());
  }
  for (std::size_t i = 0; i < req.images.size(); ++i) {
    futures.push_back(pool.submit([&req, &m, &options, &decoded, i, check_call] {
      check_call();
      const auto* data = reinterpret_cast<const std::uint8_t*>(req.images[i].data());
      at::Tensor img;
      // server.gpu_image_decode: this task's device work (decode, resize, normalise) on a
      // stream of PyTorch's pool, not on the legacy default stream that every pool thread
      // would share (and wait for in its synchronisation below).
      std::optional<models::StreamGuard> stream;
      if (!m.image_decode.empty()) stream.emplace(m.device);
      try {
        // server.gpu_image_decode: the `image_decode` slot (nvJPEG onto the model's device;
        // what it declines comes back from the CPU reference, on the CPU).
        if (!decoded.empty()) {
          if (!decoded[i].error.empty()) throw image::ImageError(decoded[i].error);
          img = decoded[i].pixels;
        } else {
          img = m.image_decode.empty()
                    ? image::decode_image(data, req.images[i].size(), options)
                    : image::decode_image(m.image_decode, data, req.images[i].size(), options,
                                          m.device.index());
        }
      } catch (const kernels::OutOfMemory&) {
        throw;  // the device's, not the client's: RESOURCE_EXHAUSTED (InferPipeline::run)
      } catch (const std::exception& ex) {
        throw Error(Code::invalid_argument, c10::str("input 'images': image ", i, ": ", ex.what()));
      }
      try {
        // A CUDA image: the `image_preprocess` slot (one kernel into pixel_values in the model's
        // dtype; what it declines, and an empty handle, take the processor's ATen ops).
        auto out = img.is_cuda() && !m.image_preprocess.empty()
                       ? image::preprocess(m.image_preprocess, *m.processor, {img}, m.dtype)
                       : m.processor->preprocess({img});
        if (img.is_cuda()) {
          // Resized and normalised on the device, on this pool thread's current stream: wait
          // for it here, so that the instance, which copies the pixels into its batch on its
          // own stream, reads finished work.
          models::StreamEvent done(img.device());
          done.record();
          done.synchronize();
        } else if (m.device.is_cuda()) {
          // Pinned here, in parallel across the pool, so that the instance copies the image to
          // the device by DMA instead of staging it on its own thread
          // (server/instance/model_instance.cpp assemble).
          out.pixel_values = out.pixel_values.pin_memory();
        }
        return out;
      } catch (const c10::OutOfMemoryError&) {
        throw;
      } catch (const c10::Error& ex) {
        // ATen's checks on the image's own size, e.g. a 40000x1 image that Deformable DETR's
        // shortest/longest-edge resize maps to 0 rows (transformers fails on it too): the
        // client's input, not a server failure.
        throw Error(Code::invalid_argument,
                    c10::str("input 'images': image ", i, " (", img.size(2), "x", img.size(1),
                             " pixels) cannot be preprocessed: ", ex.what_without_backtrace()));
      }
    }));
  }
  std::exception_ptr first_error;
  std::vector<image::ProcessorOutput> parts;
  for (auto& f : futures) {  // wait for every task: they reference `req`
    try {
      parts.push_back(f.get());
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  const bool pads = m.processor->config().do_pad;
  for (const auto& p : parts) {
    if (!pads && (p.pixel_values.size(2) != parts[0].pixel_values.size(2) ||
                  p.pixel_values.size(3) != parts[0].pixel_values.size(3)))
      throw Error(
          Code::invalid_argument,
          "input 'images': images resize to different sizes and the processor does not pad");
    pixels.push_back(p.pixel_values);
  }
  if (req.target_sizes.empty())
    for (const auto& p : parts) req.target_sizes.push_back(p.original_sizes.at(0));
}

/// Whether `m`'s requests of different sizes may share a forward: its processor pads (do_pad)
/// and its family reads pixel_mask (models::Family::pixel_mask), so that an image padded into a
/// larger batch keeps the outputs it has alone. A model of no registered family (a test's fake)
/// does not.
bool batches_any_size(const LoadedModel& m) {
  if (!m.processor->config().do_pad) return false;
  const auto* family = models::FamilyRegistry::builtin().find(m.model->model_type());
  return family != nullptr && family->pixel_mask;
}

}  // namespace

InferPipeline::InferPipeline(const ServerConfig& config, Metrics& metrics, ThreadPool& pool)
    : config_(config), metrics_(metrics), pool_(pool) {}

api::InferResponse InferPipeline::run(ModelLease& lease, api::InferRequest& request) {
  const auto t0 = Clock::now();
  auto& e = lease.entry;
  try {
    auto response = run_on(lease, request);
    const double s = seconds_since(t0);
    metrics_.request(e->name, e->version, "OK", s);
    std::lock_guard<std::mutex> ek(e->mu);
    add_duration(e->stats.success, s);
    return response;
  } catch (const Error& err) {
    const double s = seconds_since(t0);
    metrics_.request(e->name, e->version, api::code_name(err.code()), s);
    std::lock_guard<std::mutex> ek(e->mu);
    add_duration(e->stats.fail, s);
    throw;
  } catch (const std::exception& ex) {
    const double s = seconds_since(t0);
    // A kernel slot's transient out-of-memory (kernels/out_of_memory.h; the instance maps
    // the forward's, this one any other caller's): retryable.
    const bool oom = dynamic_cast<const kernels::OutOfMemory*>(&ex) != nullptr;
    metrics_.request(e->name, e->version, oom ? "RESOURCE_EXHAUSTED" : "INTERNAL", s);
    {
      std::lock_guard<std::mutex> ek(e->mu);
      add_duration(e->stats.fail, s);
    }
    // c10::Error's what() carries the C++ backtrace: log it, answer without it.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&ex);
    if (oom) throw Error(Code::resource_exhausted, "model '" + e->name + "': " + ex.what());
    log::error("model '" + e->name + "': " + ex.what());
    throw Error(Code::internal, "model '" + e->name + "': " +
                                    (c10_error ? c10_error->what_without_backtrace() : ex.what()));
  }
}

api::InferResponse InferPipeline::run_on(ModelLease& lease, api::InferRequest& request) {
  if (!lease.loaded) throw Error(Code::unavailable, lease.not_ready);
  ModelEntry& entry = *lease.entry;
  const LoadedModel& m = *lease.loaded;
  RequestLimits limits;
  limits.max_images = config_.max_images_per_request.value;
  limits.max_pixels = config_.max_pixels_per_image.value;
  limits.max_batch_size = m.serving.max_batch_size;
  const auto& pc = m.processor->config();
  std::tie(limits.max_model_pixels, limits.model_pixels_reason) =
      model_pixel_limit(pc.height, pc.width, pc.shortest_edge, pc.longest_edge, pc.do_resize);
  auto req = std::make_shared<TaskRequest>(m.task->parse(request, limits));

  const auto t_pre = Clock::now();
  auto job = std::make_shared<BatchJob>();
  job->padded = pc.do_pad;
  job->any_size = batches_any_size(m);
  if (!req->images.empty()) {
    preprocess(pool_, m, limits.max_pixels, *req, request, job->pixels);
  } else {
    job->pixels.push_back(req->pixel_values);
    if (req->target_sizes.empty())
      req->target_sizes.assign(req->batch, {req->pixel_values.size(2), req->pixel_values.size(3)});
  }
  const double pre_s = seconds_since(t_pre);
  metrics_.preprocess(entry.name, entry.version, pre_s);

  job->request = req;
  job->deadline = request.deadline;
  if (!job->deadline && m.serving.default_timeout_microseconds > 0) {
    job->deadline =
        Clock::now() + std::chrono::microseconds(m.serving.default_timeout_microseconds);
  }
  const std::shared_ptr<api::CancelToken> token = request.cancel;
  if (token) job->cancelled = [token] { return token->cancelled(); };
  auto future = lease.instances->submit(job);
  // A cancelled call frees its queue slot at once (one already running finishes; gRPC drops its
  // answer): the token's notification takes the job out of the queue and answers it with the
  // token's reason (CANCELLED, or DEADLINE_EXCEEDED from the transport's deadline timer), which
  // wakes future.get() below. No polling: the wait ends with the answer or the notification.
  std::optional<BatchResult> result;
  if (token) {
    const auto instances = lease.instances;
    const int id = token->subscribe([instances, job, token] {
      instances->cancel(job, token->reason() == Code::deadline_exceeded ? Code::deadline_exceeded
                                                                        : Code::cancelled);
    });
    try {
      result.emplace(future.get());
    } catch (...) {
      token->unsubscribe(id);
      throw;
    }
    token->unsubscribe(id);
  } else {
    result.emplace(future.get());
  }
  BatchResult& r = *result;  // future.get() threw api::Error (deadline, cancelled, failure)
  metrics_.queue(entry.name, entry.version, r.queue_seconds);
  metrics_.compute(entry.name, entry.version, r.input_seconds + r.infer_seconds + r.output_seconds);
  {
    std::lock_guard<std::mutex> ek(entry.mu);
    entry.stats.last_inference_ms = now_ms();
    add_duration(entry.stats.queue, r.queue_seconds);
    add_duration(entry.stats.compute_input, pre_s + r.input_seconds);
    add_duration(entry.stats.compute_infer, r.infer_seconds);
    add_duration(entry.stats.compute_output, r.output_seconds);
  }
  api::InferResponse response;
  response.model_name = entry.name;
  response.model_version = entry.version;
  response.id = request.id;
  response.outputs = std::move(r.outputs);
  return response;
}

}  // namespace libreyolo::server
