// A task adapter per task (object detection, image classification, instance segmentation),
// chosen once at load from what the model describes (models::ModelDescription): request
// parsing, post-processing, the output tensors and what ModelMetadata/ModelConfig report. The
// pipeline and the model instances call it and never branch on the task (DESIGN.md "Serving").
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/image/panoptic.h"
#include "models/image/postprocess.h"
#include "models/model.h"
#include "models/prompted.h"
#include "server/api/types.h"
#include "server/config/serving_config.h"
#include "server/tasks/image_inputs.h"

namespace libreyolo::server {

/// A validated request of any task (views into the api::InferRequest: keep it alive).
struct TaskRequest : ImageInputs {
  /// Per image (height, width) in pixels that boxes/masks are scaled to: the request's
  /// `target_sizes`, else (filled by the pipeline) the images' original sizes, or H x W of
  /// `pixel_values`.
  std::vector<std::pair<int64_t, int64_t>> target_sizes;
  /// Detection: threshold, top_k, use_focal_loss. Classification: top_k (0: 5).
  image::PostProcessOptions post;
  /// Instance segmentation: request parameter `mask_threshold` (mask logits > it; default 0).
  double mask_threshold = 0.0;
  /// Panoptic segmentation: threshold, mask_threshold, overlap_mask_area_threshold,
  /// label_ids_to_fuse (panoptic_io.h).
  image::PanopticOptions panoptic;
  /// Open-vocabulary detection (prompted_detection_io.h): the labels of each image (N lists),
  /// the thresholds, and the labels cut to the token limit ("image:label" pairs, "," separated).
  std::vector<std::vector<std::string>> prompts;
  models::PromptThresholds prompt_thresholds;
  std::string truncated_labels;
  /// Open-vocabulary detection: the task sentence of each image (N strings; "" = the family's
  /// default: the request parameter `task` unset), and whether it is cut to the token limit.
  std::vector<std::string> tasks;
  bool task_truncated = false;
  std::set<std::string> outputs;  ///< the requested outputs, defaults filled in
};

/// One task's request and response rules. Stateless after construction; shared by every
/// request of the model version it was made for.
class TaskAdapter {
 public:
  virtual ~TaskAdapter() = default;

  /// The Hugging Face pipeline name: "object_detection", "image_classification",
  /// "instance_segmentation", "panoptic_segmentation", "zero_shot_object_detection".
  virtual const char* name() const = 0;

  /// Validates the request against `limits`. Throws api::Error INVALID_ARGUMENT naming the
  /// tensor or parameter and the problem (detector_io.h / classifier_io.h list them).
  virtual TaskRequest parse(const api::InferRequest& request,
                            const RequestLimits& limits) const = 0;

  /// Whether the forward's pred_boxes are needed on the host (detection, segmentation).
  virtual bool uses_boxes() const = 0;
  /// Whether the forward's pred_masks are needed on the host (instance segmentation).
  virtual bool uses_masks() const { return false; }

  /// Post-processes this request's rows of the batch output and renders the output tensors.
  /// May throw api::Error for this request alone (segmentation: RESOURCE_EXHAUSTED past the
  /// mask budget): its call is answered with that error. Called on the request's own thread,
  /// concurrently for the requests of one batch (InferPipeline): must be thread-safe.
  /// `output.logits` (n, ...) and, when uses_boxes(), `output.pred_boxes` (n, Q, 4): host
  /// float32, n = the request's images.
  virtual std::vector<api::OutputTensor> respond(const models::ModelOutput& output,
                                                 const TaskRequest& request) const = 0;

  /// ModelMetadata's inputs and outputs (batch dimension -1).
  virtual std::vector<api::TensorMetadata> input_metadata() const = 0;
  virtual std::vector<api::TensorMetadata> output_metadata() const = 0;

  /// The task's ModelConfig parameters ("threshold", "top_k": the serving.yaml defaults).
  virtual std::map<std::string, std::string> config_parameters() const = 0;
};

/// The adapter of `model`'s task with the defaults of `serving` (threshold, top_k). Throws
/// std::runtime_error for a task no adapter serves.
std::unique_ptr<TaskAdapter> make_task_adapter(const models::Model& model,
                                               const ServingConfig& serving);

}  // namespace libreyolo::server
