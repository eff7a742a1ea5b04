#include "server/tasks/task_adapter.h"

#include <stdexcept>

#include "server/tasks/classifier_io.h"
#include "server/tasks/detector_io.h"
#include "server/tasks/document_layout_io.h"
#include "server/tasks/panoptic_io.h"
#include "server/tasks/prompted_detection_io.h"
#include "server/tasks/segmentation_io.h"

namespace libreyolo::server {
namespace {

/// Object detection: the DETR heads' boxes, scores and labels (detector_io.h).
class DetectionTask : public TaskAdapter {
 public:
  DetectionTask(const models::ModelDescription& d, std::map<int64_t, std::string> labels,
                const ServingConfig& serving)
      : description_(d), labels_(std::move(labels)), serving_(serving) {}

  const char* name() const override { return "object_detection"; }
  bool uses_boxes() const override { return true; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    return from_detector(
        parse_detector_request(request, limits, serving_.threshold, serving_.top_k));
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& out,
                                         const TaskRequest& r) const override {
    const auto detections = image::post_process_object_detection(
        out.logits, out.pred_boxes, r.target_sizes, description_.head, r.post);
    const bool raw = r.outputs.count("logits") || r.outputs.count("pred_boxes");
    return detector_outputs(detections, raw ? out.logits.contiguous() : at::Tensor(),
                            raw ? out.pred_boxes.contiguous() : at::Tensor(), labels_, r.outputs);
  }

  std::vector<api::TensorMetadata> input_metadata() const override {
    return detector_input_metadata();
  }
  std::vector<api::TensorMetadata> output_metadata() const override {
    return detector_output_metadata(description_.num_queries, description_.num_labels);
  }
  std::map<std::string, std::string> config_parameters() const override {
    return {{"threshold", std::to_string(serving_.threshold)},
            {"top_k", std::to_string(serving_.top_k)}};
  }

 protected:
  TaskRequest from_detector(DetectorRequest d) const {
    TaskRequest r;
    static_cast<ImageInputs&>(r) = std::move(d);
    r.target_sizes = std::move(d.target_sizes);
    r.post = d.post;
    r.post.use_focal_loss = description_.use_focal_loss;
    r.outputs = std::move(d.outputs);
    return r;
  }

  models::ModelDescription description_;
  std::map<int64_t, std::string> labels_;
  ServingConfig serving_;
};

/// Instance segmentation: a detector's I/O plus a binary mask per instance at the target size
/// (segmentation_io.h; RfDetrImageProcessor.post_process_instance_segmentation).
class SegmentationTask final : public DetectionTask {
 public:
  using DetectionTask::DetectionTask;

  const char* name() const override { return "instance_segmentation"; }
  bool uses_masks() const override { return true; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    auto s = parse_segmentation_request(request, limits, serving_.threshold, serving_.top_k);
    const double mask_threshold = s.mask_threshold;
    TaskRequest r = from_detector(std::move(s));
    r.mask_threshold = mask_threshold;
    return r;
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& out,
                                         const TaskRequest& r) const override {
    image::InstanceSegmentationOptions o;
    o.threshold = r.post.threshold;
    o.mask_threshold = r.mask_threshold;
    o.top_k = r.post.top_k;
    o.max_mask_pixels = kMaxMaskBytes;
    std::vector<image::InstanceMasks> instances;
    try {
      instances = image::post_process_instance_segmentation(out.logits, out.pred_boxes,
                                                            out.pred_masks, r.target_sizes, o);
    } catch (const std::length_error& e) {
      throw api::Error(api::Code::resource_exhausted,
                       std::string(e.what()) +
                           " (raise 'threshold', lower 'top_k' or ask smaller 'target_sizes')");
    }
    const bool raw = r.outputs.count("logits") || r.outputs.count("pred_boxes");
    return segmentation_outputs(instances, raw ? out.logits.contiguous() : at::Tensor(),
                                raw ? out.pred_boxes.contiguous() : at::Tensor(), labels_,
                                r.outputs);
  }

  std::vector<api::TensorMetadata> output_metadata() const override {
    return segmentation_output_metadata(description_.num_queries, description_.num_labels);
  }
};

/// Panoptic segmentation: DetrImageProcessor.post_process_panoptic_segmentation at the target
/// sizes (panoptic_io.h), the detector's outputs on request.
class PanopticTask final : public DetectionTask {
 public:
  using DetectionTask::DetectionTask;

  const char* name() const override { return "panoptic_segmentation"; }
  bool uses_masks() const override { return true; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    auto p = parse_panoptic_request(request, limits, serving_.threshold, serving_.top_k);
    const auto panoptic = p.panoptic;
    TaskRequest r = from_detector(std::move(p));
    r.panoptic = panoptic;
    return r;
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& out,
                                         const TaskRequest& r) const override {
    const auto results = image::post_process_panoptic_segmentation(out.logits, out.pred_masks,
                                                                   r.target_sizes, r.panoptic);
    std::vector<image::Detections> detections;
    if (panoptic_wants_detections(r.outputs))
      detections = image::post_process_object_detection(out.logits, out.pred_boxes, r.target_sizes,
                                                        description_.head, r.post);
    const bool raw = r.outputs.count("logits") || r.outputs.count("pred_boxes");
    return panoptic_outputs(results, detections, raw ? out.logits.contiguous() : at::Tensor(),
                            raw ? out.pred_boxes.contiguous() : at::Tensor(), labels_, r.outputs);
  }

  std::vector<api::TensorMetadata> output_metadata() const override {
    return panoptic_output_metadata(description_.num_queries, description_.num_labels);
  }
  std::map<std::string, std::string> config_parameters() const override {
    return {{"threshold", std::to_string(serving_.threshold)},
            {"top_k", std::to_string(serving_.top_k)},
            {"mask_threshold", "0.5"},
            {"overlap_mask_area_threshold", "0.8"}};
  }
};

/// Image classification: softmax top-k (classifier_io.h).
class ClassificationTask final : public TaskAdapter {
 public:
  ClassificationTask(const models::ModelDescription& d, std::map<int64_t, std::string> labels,
                     const ServingConfig& serving)
      : description_(d), labels_(std::move(labels)), serving_(serving) {}

  const char* name() const override { return "image_classification"; }
  bool uses_boxes() const override { return false; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    auto c = parse_classifier_request(request, limits, serving_.top_k);
    TaskRequest r;
    static_cast<ImageInputs&>(r) = std::move(c);
    r.post.top_k = c.top_k;
    r.outputs = std::move(c.outputs);
    return r;
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& out,
                                         const TaskRequest& r) const override {
    const auto logits = out.logits.contiguous();
    return classifier_outputs(logits, image::classify(logits, r.post.top_k), labels_, r.outputs);
  }

  std::vector<api::TensorMetadata> input_metadata() const override {
    return classifier_input_metadata();
  }
  std::vector<api::TensorMetadata> output_metadata() const override {
    return classifier_output_metadata(description_.num_labels);
  }
  std::map<std::string, std::string> config_parameters() const override {
    return {{"top_k", std::to_string(serving_.top_k)}};
  }

 private:
  models::ModelDescription description_;
  std::map<int64_t, std::string> labels_;
  ServingConfig serving_;
};

}  // namespace

std::unique_ptr<TaskAdapter> make_task_adapter(const models::Model& model,
                                               const ServingConfig& serving) {
  const auto& d = model.description();
  // Open-vocabulary detectors (models/prompted.h): text in, label texts out.
  if (const auto* prompted = models::prompted_detector(model))
    return make_prompted_detection_task(model, *prompted, serving);
  switch (d.task) {
    case models::Task::object_detection:
      // Document layout (PP-DocLayoutV2/V3): detections in reading order, V3's masks on request.
      if (d.head == image::DetectionHead::pp_doclayout ||
          d.head == image::DetectionHead::pp_doclayout_v2)
        return make_document_layout_task(d, model.id2label(), serving);
      return std::make_unique<DetectionTask>(d, model.id2label(), serving);
    case models::Task::instance_segmentation:
      return std::make_unique<SegmentationTask>(d, model.id2label(), serving);
    case models::Task::panoptic_segmentation:
      return std::make_unique<PanopticTask>(d, model.id2label(), serving);
    case models::Task::image_classification: {
      auto c = d;
      if (c.num_labels < 0 && !model.id2label().empty())
        c.num_labels = static_cast<int64_t>(model.id2label().size());
      return std::make_unique<ClassificationTask>(c, model.id2label(), serving);
    }
  }
  throw std::runtime_error("model_type " + d.model_type + ": no task adapter for its task");
}

}  // namespace libreyolo::server
