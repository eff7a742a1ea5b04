// Classifier I/O of ModelInfer (DESIGN.md "Serving"; ViT, Swin). Inputs: `images` BYTES [N]
// (encoded JPEG/PNG) or `pixel_values` FP32 [N,3,H,W] (already rescaled and normalised); request
// parameter `top_k` (K; 0 or absent: serving.yaml top_k, 0 there means 5; capped at C; the rule:
// image_inputs.h top_k_param). Outputs, named
// like the detector's so one client reads both:
//   `logits`        FP32  [N,C]  raw classifier logits
//   `probabilities` FP32  [N,C]  softmax(logits) over C
//   `scores`        FP32  [N,K]  the K highest probabilities, descending
//   `labels`        INT64 [N,K]  their class indices (config.json id2label keys)
//   `label_names`   BYTES [N,K]  id2label[label], or transformers' "LABEL_<i>" when absent
// All five by default; `outputs` in the request selects a subset. This is the top-k part of
// Triton's classification extension as separate typed tensors rather than "score:index:label"
// strings.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "models/image/postprocess.h"
#include "server/api/types.h"
#include "server/tasks/image_inputs.h"

namespace libreyolo::server {

/// A validated classifier request (views into the api::InferRequest: keep it alive).
struct ClassifierRequest : ImageInputs {
  int64_t top_k = 0;              ///< K (0: image::classify's default, 5)
  std::set<std::string> outputs;  ///< requested outputs (defaults filled in)
};

/// Validates `request` for a classifier. Throws api::Error INVALID_ARGUMENT naming the tensor or
/// parameter and the problem (unknown input such as `target_sizes`, wrong datatype, wrong shape,
/// shape/byte-size mismatch, malformed BYTES, empty batch, N above a limit, empty image, bad
/// `top_k`, unknown output). Other parameters (Triton's priority, timeout...) are ignored, as is
/// the detector's `threshold`.
ClassifierRequest parse_classifier_request(const api::InferRequest& request,
                                           const RequestLimits& limits, int64_t default_top_k);

/// Output tensors from `logits` (N, C) float32 CPU and its top-k `classes`
/// (image::classify(logits, K)). `id2label` names the labels.
std::vector<api::OutputTensor> classifier_outputs(const at::Tensor& logits,
                                                  const image::Classifications& classes,
                                                  const std::map<int64_t, std::string>& id2label,
                                                  const std::set<std::string>& outputs);

/// The default outputs (every one).
const std::vector<std::string>& classifier_default_outputs();

/// Inputs and outputs as ModelMetadata reports them (batch dimension -1; C = `num_labels`,
/// -1 when unknown; K varies per request: -1).
std::vector<api::TensorMetadata> classifier_input_metadata();
std::vector<api::TensorMetadata> classifier_output_metadata(int64_t num_labels);

}  // namespace libreyolo::server
