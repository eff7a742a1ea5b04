// RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024) and
// RT-DETRv2 (Lv et al., 2024), as transformers 5.17 RTDetrForObjectDetection /
// RTDetrV2ForObjectDetection with the ResNet-vd backbone (`rt_detr_resnet`).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

#include "models/model.h"

namespace libreyolo::models {

/// Loads `dir`/model.safetensors for config.json `model_type` "rt_detr" or "rt_detr_v2"
/// (`config` is the parsed config.json). Throws std::runtime_error (core::ConfigError /
/// core::CheckpointError) naming config.json and the field, or the checkpoint and key.
std::unique_ptr<Model> load_rtdetr(const std::string& dir, const nlohmann::json& config,
                                   const LoadOptions& options);

}  // namespace libreyolo::models
