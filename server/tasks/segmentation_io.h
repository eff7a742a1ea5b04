// Instance segmentation I/O of ModelInfer (DESIGN.md "Serving"): the detector's inputs and
// outputs (detector_io.h) plus the instances' masks at each image's target size (the original
// image size unless `target_sizes` says otherwise). Parameters: the detector's `threshold`,
// `top_k`, and `mask_threshold` (a finite number; mask logits > it; default 0, as upstream) and
// `mask_format` ("binary", the default, or "rle"). Outputs, K = the most instances of an image
// in the request, H x W = the largest target height and width in it:
// - `masks` UINT8 [N,K,H,W] (binary): 1 inside the instance; image i's masks fill the top-left
//   H_i x W_i of each plane, zeros elsewhere and for the K - k_i padding instances;
// - `rle_counts` INT64 [N,K,C] and `rle_size` INT64 [N,2] (rle): COCO uncompressed RLE, the
//   counts of each mask (column-major, zeros first) followed by -1 up to C = the longest, and
//   (height, width) of each image.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/image/instance_segmentation.h"
#include "server/api/types.h"
#include "server/tasks/detector_io.h"

namespace libreyolo::server {

/// The most mask bytes one response may carry (`masks` with its padding; `rle_counts` at 8
/// bytes a count), and the most mask pixels the post-processing may make for one request:
/// beyond it the request is answered RESOURCE_EXHAUSTED naming the numbers (raise `threshold`,
/// lower `top_k`, or ask smaller `target_sizes`), and the other requests of its batch are served.
constexpr int64_t kMaxMaskBytes = int64_t{256} << 20;

/// A validated instance segmentation request (views into the api::InferRequest).
struct SegmentationRequest : DetectorRequest {
  double mask_threshold = 0.0;
};

/// The detector's checks (parse_detector_request) plus `mask_threshold` and `mask_format`.
/// Throws api::Error INVALID_ARGUMENT: "parameter 'mask_format' must be \"binary\" or \"rle\",
/// got \"<value>\"" (or "got a <type>" for a non-string), "parameter 'mask_threshold' must be a
/// finite number, got nan", and the detector's messages.
SegmentationRequest parse_segmentation_request(const api::InferRequest& request,
                                               const RequestLimits& limits,
                                               double default_threshold, int64_t default_top_k);

/// The detector's output tensors for `instances` plus masks as `outputs` asks (see above).
/// Throws api::Error RESOURCE_EXHAUSTED "masks [N,K,H,W] would be B bytes, above the limit of
/// 268435456 (...)" (or "rle_counts [N,K,C] ...") past kMaxMaskBytes.
std::vector<api::OutputTensor> segmentation_outputs(
    const std::vector<image::InstanceMasks>& instances, const at::Tensor& logits,
    const at::Tensor& pred_boxes, const std::map<int64_t, std::string>& id2label,
    const std::set<std::string>& outputs);

/// Inputs and outputs as ModelMetadata reports them (batch dimension -1).
std::vector<api::TensorMetadata> segmentation_output_metadata(int64_t num_queries,
                                                              int64_t num_labels);

}  // namespace libreyolo::server
