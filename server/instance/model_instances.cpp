#include "server/instance/model_instances.h"

#include <utility>

namespace libreyolo::server {

ModelInstances::ModelInstances(std::unique_ptr<Scheduler> scheduler,
                               std::vector<std::shared_ptr<LoadedModel>> instances,
                               InstanceHooks hooks)
    : hooks_(std::move(hooks)), scheduler_(std::move(scheduler)) {
  std::size_t cpu = 0;
  for (const auto& m : instances) cpu += m->device.is_cpu();
  for (std::size_t i = 0; i < instances.size(); ++i)
    instances_.push_back(std::make_unique<ModelInstance>(
        i, instances.size(), std::move(instances[i]), *scheduler_, hooks_, cpu));
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
