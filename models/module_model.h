// A Model over one torch::nn::Module tree: the accessors and input checks every family shares,
// so that a family only writes its forward().
#pragma once

#include <c10/util/StringUtil.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "models/layers/attention.h"
#include "models/model.h"

namespace libreyolo::models {

/// `Net` is the family's root module; it must have a `config` member with `id2label`.
template <class Net>
class ModuleModel : public Model {
 public:
  ModuleModel(std::string model_type, Task task, std::shared_ptr<Net> net, LoadOptions options)
      : model_type_(std::move(model_type)),
        task_(task),
        net_(std::move(net)),
        options_(std::move(options)) {}

  std::string model_type() const override { return model_type_; }
  Task task() const override { return task_; }
  const std::map<int64_t, std::string>& id2label() const override { return net_->config.id2label; }
  const LoadOptions& options() const override { return options_; }
  int set_fused_attention(bool enabled) override {
    return layers::set_fused_attention(*net_, enabled);
  }
  torch::nn::Module& root() override { return *net_; }

 protected:
  /// The one input rule (models::check_pixel_values), then the conversion to the model's dtype
  /// and device (no copy when they match). Throws std::invalid_argument naming the model type.
  at::Tensor checked_input(const at::Tensor& pixel_values, int64_t channels,
                           int64_t min_size = 1) const {
    models::check_pixel_values(model_type_, pixel_values, channels, min_size);
    return pixel_values.to(options_.device, options_.dtype);
  }

  std::string model_type_;
  Task task_;
  std::shared_ptr<Net> net_;
  LoadOptions options_;
};

}  // namespace libreyolo::models
