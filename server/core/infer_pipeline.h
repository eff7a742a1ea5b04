// The request path of one ModelInfer, after Triton's: parse (the model's task adapter) ->
// preprocess (images decoded and resized in parallel on the CPU pool) -> batch (the model's
// dynamic batcher, which pads and converts once) -> forward -> post-process -> output tensors,
// with the statistics and metrics of each step.
#pragma once

#include "server/api/types.h"
#include "server/config/config.h"
#include "server/metrics/metrics.h"
#include "server/lifecycle/model_lifecycle.h"
#include "server/core/thread_pool.h"

namespace libreyolo::server {

class InferPipeline {
 public:
  /// `pool` decodes and preprocesses images; all three must outlive the pipeline.
  InferPipeline(const ServerConfig& config, Metrics& metrics, ThreadPool& pool);

  /// Runs `request` on the leased model version and records its statistics (success, fail,
  /// queue, compute) and metrics. Throws api::Error: UNAVAILABLE when the lease holds no READY
  /// model, INVALID_ARGUMENT for a bad request (the adapter's and the images' messages),
  /// RESOURCE_EXHAUSTED (queue full), DEADLINE_EXCEEDED, CANCELLED, INTERNAL (a failed forward;
  /// c10's backtrace is logged, not returned).
  api::InferResponse run(ModelLease& lease, api::InferRequest& request);

 private:
  api::InferResponse run_on(ModelLease& lease, api::InferRequest& request);

  const ServerConfig& config_;
  Metrics& metrics_;
  ThreadPool& pool_;
};

}  // namespace libreyolo::server
