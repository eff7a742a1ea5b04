#include "server/core/infer_pipeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <future>
#include <optional>
#include <stdexcept>
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

/// INVALID_ARGUMENT for image `i` of the request that did not decode (`what`: the decoder's text).
Error undecodable(std::size_t i, const std::string& what) {
  return Error(Code::invalid_argument, c10::str("input 'images': image ", i, ": ", what));
}

/// INVALID_ARGUMENT for image `i` (`width` x `height` decoded) that ATen's preprocessing refused:
/// its own size, e.g. a 40000x1 image that Deformable DETR's shortest/longest-edge resize maps to
/// 0 rows (transformers fails on it too): the client's input, not a server failure.
Error unprocessable(std::size_t i, int64_t width, int64_t height, const c10::Error& ex) {
  return Error(Code::invalid_argument,
               c10::str("input 'images': image ", i, " (", width, "x", height,
                        " pixels) cannot be preprocessed: ", ex.what_without_backtrace()));
}

/// Decodes and preprocesses every encoded image of `req`: its JPEGs through the model's
/// DecodeBatcher when it has one (server.gpu_image_decode), and every other image (or every one
/// without it) on `pool`, one task per image. Fills `pixels` (one (1, 3, h, w) tensor per image,
/// unpadded: the instance pads once; float32 on the CPU, the model's dtype on its device) and,
/// when the request gave no target_sizes, the original sizes. Throws INVALID_ARGUMENT naming the
/// first bad image (undecodable or unprocessable); CANCELLED / DEADLINE_EXCEEDED when the call
/// ended before its images were decoded (a pool task then skips its image: the pool serves other
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
  // server.gpu_image_decode: the JPEGs through the model's DecodeBatcher, batched with those of
  // concurrent requests (nvJPEG's engines work on batches). Other formats, and what it declines
  // (not a JPEG the hardware decoder takes), take a pool task below, as every image does without
  // it.
  std::vector<DecodeBatcher::Result> batched(req.images.size());
  if (m.decode_batcher) {
    std::vector<std::size_t> jpegs;
    std::vector<kernels::EncodedImage> encoded;
    for (std::size_t i = 0; i < req.images.size(); ++i) {
      const auto& im = req.images[i];
      const auto* p = reinterpret_cast<const std::uint8_t*>(im.data());
      if (image::sniff_format(p, im.size()) != image::ImageFormat::jpeg) continue;
      jpegs.push_back(i);
      encoded.push_back({p, im.size()});
    }
    if (!encoded.empty()) {
      check_call();
      auto r = m.decode_batcher->run(encoded, options);
      for (std::size_t k = 0; k < jpegs.size(); ++k) batched[jpegs[k]] = std::move(r[k]);
      check_call();  // the call may have ended while its images waited for their round
    }
  }
  // The batcher's answer for image i: its pixels, or the error the task below would throw.
  const auto handled = [&batched](std::size_t i) {
    const auto& b = batched[i];
    return b.out.has_value() || !b.error.empty() || b.failure != nullptr;
  };
  const auto take = [&batched](std::size_t i) -> image::ProcessorOutput {
    auto& b = batched[i];
    if (!b.error.empty()) throw undecodable(i, b.error);
    if (b.failure) {
      try {
        std::rethrow_exception(b.failure);
      } catch (const c10::OutOfMemoryError&) {
        throw;
      } catch (const c10::Error& ex) {
        throw unprocessable(i, b.width, b.height, ex);
      }
    }
    return std::move(*b.out);
  };
  for (std::size_t i = 0; i < req.images.size(); ++i) {
    if (handled(i)) continue;
    futures.push_back(pool.submit([&req, &m, &options, i, check_call] {
      check_call();
      const auto* data = reinterpret_cast<const std::uint8_t*>(req.images[i].data());
      at::Tensor img;
      // server.gpu_image_decode: this task's device work (decode, resize, normalise) on a
      // high-priority stream of PyTorch's pool (it sits on the request's path while forwards
      // fill the GPU), not on the legacy default stream that every pool thread would share
      // (and wait for in its synchronisation below).
      std::optional<models::StreamGuard> stream;
      if (!m.image_decode.empty()) stream.emplace(m.device, models::StreamGuard::Priority::high);
      try {
        // server.gpu_image_decode: the `image_decode` slot (nvJPEG onto the model's device;
        // what it declines comes back from the CPU reference, on the CPU).
        img = m.image_decode.empty()
                  ? image::decode_image(data, req.images[i].size(), options)
                  : image::decode_image(m.image_decode, data, req.images[i].size(), options,
                                        m.device.index());
      } catch (const kernels::OutOfMemory&) {
        throw;  // the device's, not the client's: RESOURCE_EXHAUSTED (InferPipeline::run)
      } catch (const std::exception& ex) {
        throw undecodable(i, ex.what());
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
        throw unprocessable(i, img.size(2), img.size(1), ex);
      }
    }));
  }
  std::exception_ptr first_error;
  std::vector<image::ProcessorOutput> parts;
  auto task = futures.begin();
  for (std::size_t i = 0; i < req.images.size(); ++i) {  // every task waited for: they use `req`
    try {
      parts.push_back(handled(i) ? take(i) : (task++)->get());
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
  // This request's answer, rendered here on its own thread from its rows of the batch
  // (BatchResult): the batch's requests render in parallel. respond() may throw api::Error for
  // this request alone (segmentation's mask budget).
  const auto t_out = Clock::now();
  api::InferResponse response;
  const auto not_answered = [&entry, images = r.rows.logits.size(0)] {
    // The batch counted every image it ran (inference_count); Triton counts successful ones.
    std::lock_guard<std::mutex> ek(entry.mu);
    entry.stats.inference_count -= static_cast<std::uint64_t>(images);
  };
  try {
    at::InferenceMode inference;
    response.outputs = m.task->respond(r.rows, *req);
  } catch (const std::invalid_argument& e) {  // the request's own values (as the instance maps it)
    not_answered();
    throw Error(Code::invalid_argument, "model '" + entry.name + "': " + e.what());
  } catch (...) {
    not_answered();
    throw;
  }
  r.rows = {};  // this request's hold on the batch's host tensors
  const double output_s = seconds_since(t_out);
  metrics_.queue(entry.name, entry.version, r.queue_seconds);
  metrics_.compute(entry.name, entry.version, r.input_seconds + r.infer_seconds + output_s);
  {
    std::lock_guard<std::mutex> ek(entry.mu);
    entry.stats.last_inference_ms = now_ms();
    add_duration(entry.stats.queue, r.queue_seconds);
    add_duration(entry.stats.compute_input, pre_s + r.input_seconds);
    add_duration(entry.stats.compute_infer, r.infer_seconds);
    add_duration(entry.stats.compute_output, output_s);
    // The batch's entry counts the execution (the instance's hook); its requests add their time.
    auto b = entry.batch_stats.find(static_cast<std::uint64_t>(r.batch_size));
    if (b != entry.batch_stats.end())
      b->second.compute_output.ns += static_cast<std::uint64_t>(output_s * 1e9);
  }
  response.model_name = entry.name;
  response.model_version = entry.version;
  response.id = request.id;
  return response;
}

}  // namespace libreyolo::server
