// Detector I/O of ModelInfer (DESIGN.md "Serving"): validation of the inputs and parameters
// against the limits, and the output tensors. Inputs: `images` BYTES [N] (encoded JPEG/PNG) or
// `pixel_values` FP32 [N,3,H,W]; optional `target_sizes` INT64 [N,2]; parameters `threshold`,
// `top_k`. Outputs: `scores` FP32 [N,K], `labels` INT64 [N,K] (-1 padding), `boxes` FP32 [N,K,4]
// (x0,y0,x1,y1 pixels), `num_detections` INT32 [N], `label_names` BYTES [N,K] ("" padding);
// `logits` / `pred_boxes` only on request. K = the largest detection count in the request.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"
#include "server/api/types.h"
#include "server/tasks/image_inputs.h"

namespace libreyolo::server {

/// A validated detector request (views into the api::InferRequest: keep it alive).
struct DetectorRequest : ImageInputs {
  std::vector<std::pair<int64_t, int64_t>> target_sizes;  ///< from `target_sizes`, else empty
  image::PostProcessOptions post;
  std::set<std::string> outputs;  ///< requested outputs (defaults filled in)
};

/// Validates `request` for a detector. Throws api::Error INVALID_ARGUMENT naming the tensor or
/// parameter and the problem (unknown input, wrong datatype, wrong shape, shape/byte-size
/// mismatch, malformed BYTES, empty batch, N above a limit, empty image, unknown output, a
/// `target_sizes` row that is not positive or whose height * width exceeds limits.max_pixels:
/// "input 'target_sizes': row I (height H, width W) exceeds the limit of P pixels per image
/// (server.max_pixels_per_image)").
/// `extra_outputs` are further outputs a task built on detection renders (segmentation_io.h);
/// `extra_inputs` further inputs it reads itself (prompted_detection_io.h: `text`), skipped here.
DetectorRequest parse_detector_request(const api::InferRequest& request,
                                       const RequestLimits& limits, double default_threshold,
                                       int64_t default_top_k,
                                       const std::vector<std::string>& extra_outputs = {},
                                       const std::vector<std::string>& extra_inputs = {});

/// Output tensors for `detections` (one per image). `logits`/`pred_boxes` are used when
/// requested. `id2label` names the labels.
std::vector<api::OutputTensor> detector_outputs(const std::vector<image::Detections>& detections,
                                                const at::Tensor& logits,
                                                const at::Tensor& pred_boxes,
                                                const std::map<int64_t, std::string>& id2label,
                                                const std::set<std::string>& outputs);

/// The default outputs and the ones available on request.
const std::vector<std::string>& detector_default_outputs();

/// Inputs and outputs as ModelMetadata reports them (batch dimension -1).
std::vector<api::TensorMetadata> detector_input_metadata();
std::vector<api::TensorMetadata> detector_output_metadata(int64_t num_queries, int64_t num_labels);

}  // namespace libreyolo::server
