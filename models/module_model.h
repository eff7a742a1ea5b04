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
  /// Throws std::invalid_argument naming the model type unless pixel_values is
  /// (B >= 1, `channels`, H >= min_size, W >= min_size) in the model's dtype on its device.
  void check_pixel_values(const at::Tensor& pixel_values, int64_t channels,
                          int64_t min_size = 1) const {
    if (!pixel_values.defined() || pixel_values.dim() != 4 || pixel_values.size(1) != channels ||
        pixel_values.size(0) < 1 || pixel_values.size(2) < min_size ||
        pixel_values.size(3) < min_size) {
      throw std::invalid_argument(c10::str(
          model_type_, ": pixel_values must be (B, ", channels, ", H, W) with B >= 1 and H, W >= ",
          min_size, ", got ", pixel_values.defined() ? pixel_values.sizes() : at::IntArrayRef{}));
    }
    if (pixel_values.scalar_type() != options_.dtype || pixel_values.device() != options_.device) {
      throw std::invalid_argument(
          c10::str(model_type_, ": pixel_values must be ", options_.dtype, " on ", options_.device,
                   ", got ", pixel_values.scalar_type(), " on ", pixel_values.device()));
    }
  }

  std::string model_type_;
  Task task_;
  std::shared_ptr<Net> net_;
  LoadOptions options_;
};

}  // namespace libreyolo::models
