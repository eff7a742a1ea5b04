// Prometheus metrics with the DESIGN.md names ("Metrics"): request/queue/compute/preprocess
// duration histograms, request counter by status code, batch size histogram, pending requests,
// model load time, and the kernel registry's state read at scrape time. No torch in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/runtime/device_memory.h"

namespace libreyolo::server {

namespace security {
class AccessPolicy;
}

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// One finished ModelInfer: libreyolo_inference_requests_total{model,version,code} and, for
  /// every code, libreyolo_request_duration_seconds{model,version} (seconds).
  void request(const std::string& model, const std::string& version, const std::string& code,
               double seconds);
  /// libreyolo_queue_duration_seconds / _compute_ / _preprocess_ {model,version} (seconds).
  void queue(const std::string& model, const std::string& version, double seconds);
  void compute(const std::string& model, const std::string& version, double seconds);
  void preprocess(const std::string& model, const std::string& version, double seconds);
  /// libreyolo_batch_size{model} (images per forward).
  void batch(const std::string& model, std::int64_t size);
  /// One DecodeBatcher round of a model instance (server.gpu_image_decode):
  /// libreyolo_decode_round_images{model} (JPEGs it took), libreyolo_decode_round_seconds{model}
  /// (decode + preprocess + the wait for the device, seconds) and, when it threw (its images
  /// then decode one by one), libreyolo_decode_round_failures_total{model}.
  void decode_round(const std::string& model, std::int64_t images, double seconds, bool failed);
  /// libreyolo_pending_requests{model} (requests queued, not yet running).
  void pending(const std::string& model, std::int64_t count);
  /// One batch run by a model instance (instance_group):
  /// libreyolo_instance_batches_total / libreyolo_instance_images_total and
  /// libreyolo_instance_compute_seconds_total (assembly + forward, seconds; each request's
  /// post-processing runs on its own thread, in libreyolo_compute_duration_seconds)
  /// {model,instance,device}; with `device_seconds` >= 0 (CUDA: ExecutedBatch::device_seconds)
  /// also libreyolo_instance_device_seconds_total: the batches' spans on the instance's stream,
  /// whose rate against the wall time shows the gaps between batches (not the GPU's utilisation:
  /// a span includes launch stalls inside an eager forward, and instances on one GPU overlap).
  void instance_batch(const std::string& model, const std::string& instance,
                      const std::string& device, std::int64_t images, double compute_seconds,
                      double device_seconds = -1);
  /// The requests of one batch an instance took from the shared queue:
  /// libreyolo_instance_requests_total and libreyolo_instance_queue_seconds_total (the sum of
  /// their waits, enqueue -> batch start, seconds) {model,instance,device}; queue seconds over
  /// requests is an instance's mean queue time.
  void instance_queue(const std::string& model, const std::string& instance,
                      const std::string& device, std::int64_t requests, double queue_seconds);
  /// libreyolo_instance_ready{model,instance,device}: 1 in rotation, 0 taken out (its device
  /// failed); libreyolo_instance_failures_total{model,instance,device} counts the take-outs.
  void instance_ready(const std::string& model, const std::string& instance,
                      const std::string& device, bool ready);
  /// An open-vocabulary model's prompt cache over one batch (serving.yaml prompt_cache_mb):
  /// libreyolo_prompt_cache_hits_total / libreyolo_prompt_cache_misses_total
  /// {model,instance,device}, distinct pieces (OWL: labels, Grounding DINO: captions) found in /
  /// encoded into the cache.
  void prompt_cache(const std::string& model, const std::string& instance,
                    const std::string& device, std::int64_t hits, std::int64_t misses);
  /// libreyolo_model_load_seconds{model,version} (gauge, seconds).
  void model_load(const std::string& model, const std::string& version, double seconds);

  /// Prometheus text exposition (version 0.0.4) of everything, kernel metrics included:
  /// libreyolo_kernel_active{slot,impl}, libreyolo_kernel_calls_total{slot,impl},
  /// libreyolo_kernel_declined_total{slot,impl,reason},
  /// libreyolo_kernel_fallback_total{slot,impl,reason}, libreyolo_kernel_oom_total{slot,impl}
  /// (out-of-memory failures, kernels/out_of_memory.h). Every (slot, impl) the registry knows
  /// has a declined and a fallback series with reason="none" that is always 0, so that both
  /// families have series before their first event (Prometheus' convention). `gpus` (read by
  /// the caller at scrape time, models::device_memory) becomes
  /// libreyolo_gpu_memory_{total,used,allocated,reserved}_bytes{device} (bytes). With `access`,
  /// libreyolo_api_denied_total{group,protocol}: the calls server.restricted_apis refused, one
  /// series per API group and transport from the start.
  std::string serialize(const std::vector<models::DeviceMemory>& gpus = {},
                        const security::AccessPolicy* access = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::server
