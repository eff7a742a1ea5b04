#include "server/instance/model_instances.h"

#include <algorithm>
#include <utility>

#include "models/runtime/intra_op_threads.h"

namespace libreyolo::server {

ModelInstances::ModelInstances(std::unique_ptr<Scheduler> scheduler,
                               std::vector<std::shared_ptr<LoadedModel>> instances,
                               InstanceHooks hooks)
    : hooks_(std::move(hooks)), scheduler_(std::move(scheduler)) {
  // The CPU instances share the process's intra-op threads, max(1, P / N) each, so that the
  // group's OpenMP teams fill the cores once instead of each taking all of them (and libgomp
  // then throttling every team's spin-wait: docs/DESIGN.md, Serving).
  int cpu = 0;
  for (const auto& m : instances) cpu += m->device.is_cpu();
  const int share = cpu > 0 ? std::max(1, models::process_intra_op_threads() / cpu) : 0;
  for (std::size_t i = 0; i < instances.size(); ++i) {
    const int threads = instances[i]->device.is_cpu() ? share : 0;
    instances_.push_back(std::make_unique<ModelInstance>(
        i, instances.size(), std::move(instances[i]), *scheduler_, hooks_, threads));
  }
  for (auto& inst : instances_) inst->start();
}

ModelInstances::~ModelInstances() {
  scheduler_->stop();
  for (auto& inst : instances_) inst->join();
  // Instances all taken out of rotation left nobody to drain the queue: answer it.
  scheduler_->answer_left();
}

std::size_t ModelInstances::healthy_instances() const {
  std::size_t n = 0;
  for (const auto& inst : instances_) n += inst->healthy();
  return n;
}

std::vector<InstanceStatus> ModelInstances::status() const {
  std::vector<InstanceStatus> out;
  for (const auto& inst : instances_) out.push_back(inst->status());
  return out;
}

}  // namespace libreyolo::server
