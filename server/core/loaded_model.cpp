#include "server/core/loaded_model.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

namespace libreyolo::server {
namespace {

at::Device resolve_device(const std::string& wanted) {
  if (wanted.empty() || wanted == "auto")
    return at::hasCUDA() ? at::Device("cuda:0") : at::Device(at::kCPU);
  at::Device d(wanted);
  if (d.is_cuda() && !at::hasCUDA()) {
    throw std::runtime_error("device " + wanted + " requested but no CUDA device is available");
  }
  return d;
}

at::ScalarType resolve_dtype(const std::string& name) {
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
}

}  // namespace

std::shared_ptr<LoadedModel> load_model_version(const std::string& name, const std::string& version,
                                                const std::string& dir,
                                                const ServingConfig& serving,
                                                const std::string& server_device,
                                                const ModelLoader& loader) {
  auto m = std::make_shared<LoadedModel>();
  m->name = name;
  m->version = version;
  m->dir = dir;
  m->serving = serving;
  m->device = resolve_device(serving.device.empty() ? server_device : serving.device);
  m->dtype = resolve_dtype(serving.dtype);
  const auto config = read_json(dir + "/config.json");
  const std::string model_type = config.value("model_type", std::string());
  m->use_focal_loss = config.value("use_focal_loss", true);
  m->num_queries = config.value("num_queries", int64_t{-1});
  if (config.contains("id2label") && config["id2label"].is_object()) {
    m->num_labels = static_cast<int64_t>(config["id2label"].size());
  }
  m->processor = std::make_unique<image::ImageProcessor>(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  models::LoadOptions options;
  options.device = m->device;
  options.dtype = m->dtype;
  m->model = loader(dir, options);
  if (m->model->task() != models::Task::object_detection) {
    throw std::runtime_error(dir + "/config.json: model_type '" + m->model->model_type() +
                             "' is a classifier; the daemon serves detectors only for now");
  }
  try {
    m->head = image::detection_head_for(m->model->model_type());
  } catch (const std::exception& e) {
    throw std::runtime_error(dir + "/config.json: model_type: " + e.what());
  }
  (void)model_type;
  return m;
}

void warm_up(const LoadedModel& model) {
  const auto& c = model.processor->config();
  int64_t h = c.height, w = c.width;
  if (h <= 0 || w <= 0) {
    const auto hw = model.processor->output_size(480, 640);
    h = hw.first;
    w = hw.second;
  }
  at::InferenceMode guard;
  auto pixels =
      at::zeros({1, 3, h, w}, at::TensorOptions().dtype(model.dtype).device(model.device));
  at::Tensor mask;
  if (c.do_pad)
    mask = at::ones({1, h, w}, at::TensorOptions().dtype(at::kLong).device(model.device));
  auto out = model.model->forward(pixels, mask);
  (void)out.logits.sum().item<float>();  // synchronise (CUDA)
}

}  // namespace libreyolo::server
