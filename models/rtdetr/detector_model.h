// The Model of the RT-DETR-lineage detectors (RT-DETR, RT-DETRv2, D-FINE): one input check and
// one forward for every family whose network maps pixel_values to (logits, boxes).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "models/layers/attention.h"
#include "models/model.h"
#include "models/rtdetr/modules.h"

namespace libreyolo::models::rtdetr {

/// What the input check needs from a family.
struct DetectorGeometry {
  int64_t num_channels = 3;
  int64_t stride = 32;  ///< total stride of the backbone: H and W must be multiples of it
  int64_t num_queries = 300;
  /// Encoder tokens (sum of H_l * W_l over the feature levels) for an H x W input.
  std::function<int64_t(int64_t, int64_t)> encoder_tokens;
};

/// `Net` has `std::pair<at::Tensor, at::Tensor> forward(const at::Tensor&) const` returning
/// logits (B, Q, num_labels) and pred_boxes (B, Q, 4) (cx, cy, w, h in [0, 1]), or a
/// `ModelOutput forward(const at::Tensor&) const` with more outputs (PP-DocLayoutV2: also
/// order_logits); every defined output is returned as float32.
template <class Net>
class DetectorModel final : public Model {
 public:
  DetectorModel(std::string type, DetectorGeometry geometry, std::shared_ptr<Net> net,
                std::map<int64_t, std::string> labels, LoadOptions options)
      : type_(std::move(type)),
        geometry_(std::move(geometry)),
        net_(std::move(net)),
        labels_(std::move(labels)),
        options_(options) {}

  std::string model_type() const override { return type_; }
  Task task() const override { return Task::object_detection; }

  /// pixel_values as models::check_pixel_values takes them (H, W multiples of the stride),
  /// converted to the model's dtype and device;
  /// pixel_mask is accepted and ignored: these families never use it (hf-models.md 2.4).
  /// Throws std::invalid_argument naming pixel_values for a bad shape, or when H x W gives
  /// fewer encoder tokens than num_queries (top-k query selection needs that many). Outputs
  /// are float32.
  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    models::check_pixel_values(type_, pixel_values, geometry_.num_channels, geometry_.stride,
                               geometry_.stride);
    const int64_t H = pixel_values.size(2), W = pixel_values.size(3);
    const int64_t tokens = geometry_.encoder_tokens(H, W);
    if (tokens < geometry_.num_queries)
      throw std::invalid_argument(c10::str("pixel_values: ", H, "x", W, " gives ", tokens,
                                           " encoder tokens, fewer than num_queries ",
                                           geometry_.num_queries));
    at::NoGradGuard no_grad;
    const auto x = pixel_values.to(options_.device, options_.dtype);
    auto out = net_->forward(x);
    if constexpr (std::is_same_v<decltype(out), ModelOutput>) {
      for (at::Tensor* t : {&out.logits, &out.pred_boxes, &out.pred_masks, &out.order_logits})
        if (t->defined()) *t = t->to(at::kFloat);
      return out;
    } else {
      auto& [logits, boxes] = out;
      return {logits.to(at::kFloat), boxes.to(at::kFloat)};
    }
  }

  const std::map<int64_t, std::string>& id2label() const override { return labels_; }
  const LoadOptions& options() const override { return options_; }
  int set_fused_attention(bool enabled) override {
    return layers::set_fused_attention(*net_, enabled);
  }
  torch::nn::Module& root() override { return *net_; }

 private:
  std::string type_;
  DetectorGeometry geometry_;
  std::shared_ptr<Net> net_;
  std::map<int64_t, std::string> labels_;
  LoadOptions options_;
};

}  // namespace libreyolo::models::rtdetr
