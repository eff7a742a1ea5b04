// A model's instances and the Scheduler that feeds them, as one unit: what the life cycle keeps
// per served version and what a request's lease holds until it is answered (a reload or unload
// drains the queue instead of failing it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "server/instance/loaded_model.h"
#include "server/instance/model_instance.h"
#include "server/scheduler/scheduler.h"

namespace libreyolo::server {

class ModelInstances {
 public:
  /// One worker per instance (Triton's instance_group: each with its own weights, device,
  /// stream and CUDA graphs); they take batches from `scheduler`, so a batch goes to an
  /// instance that is free. `instances` is not empty.
  ModelInstances(std::unique_ptr<Scheduler> scheduler,
                 std::vector<std::shared_ptr<LoadedModel>> instances, InstanceHooks hooks);
  /// Finishes every queued request, then joins the workers.
  ~ModelInstances();
  ModelInstances(const ModelInstances&) = delete;
  ModelInstances& operator=(const ModelInstances&) = delete;

  /// Queues a request (Scheduler::submit).
  std::future<BatchResult> submit(std::shared_ptr<BatchJob> job) {
    return scheduler_->submit(std::move(job));
  }
  /// Takes a queued request out (Scheduler::cancel).
  bool cancel(const std::shared_ptr<BatchJob>& job, api::Code code) {
    return scheduler_->cancel(job, code);
  }
  /// Requests waiting (not running).
  int64_t pending() const { return scheduler_->pending(); }

  /// Instances in rotation.
  std::size_t healthy_instances() const;

  /// Every instance, in instance_group order.
  std::vector<InstanceStatus> status() const;

 private:
  const InstanceHooks hooks_;  // before the instances, which keep a reference
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<ModelInstance>> instances_;
};

}  // namespace libreyolo::server
