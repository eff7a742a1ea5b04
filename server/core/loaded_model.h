// One served model version on the torch side: the checkpoint, its image processor and its
// serving settings.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>

#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "server/core/serving_config.h"

namespace libreyolo::server {

/// How checkpoints are loaded: models::load_model in the daemon; tests inject fakes.
using ModelLoader = std::function<std::unique_ptr<models::Model>(const std::string& dir,
                                                                 const models::LoadOptions&)>;

struct LoadedModel {
  std::string name;
  std::string version;
  std::string dir;  ///< <repo>/<model>/<version>
  ServingConfig serving;
  std::unique_ptr<models::Model> model;
  std::unique_ptr<image::ImageProcessor> processor;
  image::DetectionHead head = image::DetectionHead::rt_detr;
  bool use_focal_loss = true;  ///< config.json `use_focal_loss` (RT-DETR family)
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  int64_t num_queries = -1;  ///< config.json num_queries (-1: unknown)
  int64_t num_labels = -1;   ///< id2label size (-1: unknown)
};

/// Loads <dir> (config.json, model.safetensors, preprocessor_config.json) with `serving` on
/// `server_device` ("auto" | "cpu" | "cuda" | "cuda:N"; serving.device wins when set).
/// Detectors only for now. Throws std::runtime_error naming the file/field.
std::shared_ptr<LoadedModel> load_model_version(const std::string& name, const std::string& version,
                                                const std::string& dir,
                                                const ServingConfig& serving,
                                                const std::string& server_device,
                                                const ModelLoader& loader);

/// One forward on zeros at the processor's output size (the warm-up). Throws on failure.
void warm_up(const LoadedModel& model);

}  // namespace libreyolo::server
