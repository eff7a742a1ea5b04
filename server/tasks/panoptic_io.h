// Panoptic segmentation I/O of ModelInfer (DESIGN.md "Serving"; DetrForSegmentation): the
// detector's inputs (detector_io.h) and DetrImageProcessor.post_process_panoptic_segmentation at
// each image's target size (the original image size unless `target_sizes` says otherwise).
// Parameters: `threshold` (a query is kept when its best class score > it; default serving.yaml
// `threshold`, 0.5 as upstream), `mask_threshold` (default 0.5), `overlap_mask_area_threshold`
// (default 0.8), all finite numbers, and `label_ids_to_fuse` (a string of comma-separated class
// ids, e.g. "0,5", or one integer; default none). Outputs, H x W = the largest target height and
// width in the request, S = the most segments of an image in it:
// - `segmentation` INT32 [N,H,W]: the segment id of each pixel (0: no segment won it; -1: no
//   query passed the threshold, upstream's "no mask found"); image i fills the top-left
//   H_i x W_i, -1 elsewhere;
// - `segments_info` BYTES [N]: per image the JSON array of upstream's segments_info, each
//   {"id", "label_id", "label" (config.json id2label, else "LABEL_<id>"), "was_fused", "score"};
// - `num_segments` INT32 [N];
// on request: `segment_ids` INT32 [N,S] (0 padding), `segment_labels` INT64 [N,S] (-1 padding),
// `segment_scores` FP32 [N,S] (0 padding), and the detector's outputs (post_process_object_
// detection at `threshold`: scores, labels, boxes, num_detections, label_names; logits,
// pred_boxes).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/image/panoptic.h"
#include "server/api/types.h"
#include "server/tasks/detector_io.h"

namespace libreyolo::server {

/// A validated panoptic segmentation request (views into the api::InferRequest).
struct PanopticRequest : DetectorRequest {
  image::PanopticOptions panoptic;
};

/// The detector's checks (parse_detector_request) plus the panoptic parameters and outputs.
/// Throws api::Error INVALID_ARGUMENT: "parameter 'mask_threshold' must be a finite number, got
/// nan" (likewise 'overlap_mask_area_threshold'), "parameter 'label_ids_to_fuse' must be class
/// ids separated by commas, got \"<value>\"" (or "got a <type>"), and the detector's messages.
PanopticRequest parse_panoptic_request(const api::InferRequest& request,
                                       const RequestLimits& limits, double default_threshold,
                                       int64_t default_top_k);

/// The output tensors `outputs` asks for (see above). `detections`, `logits` and `pred_boxes`
/// are used only when a detector output is requested.
std::vector<api::OutputTensor> panoptic_outputs(const std::vector<image::PanopticResult>& results,
                                                const std::vector<image::Detections>& detections,
                                                const at::Tensor& logits,
                                                const at::Tensor& pred_boxes,
                                                const std::map<int64_t, std::string>& id2label,
                                                const std::set<std::string>& outputs);

/// Whether `outputs` has one of the detector's outputs (post_process_object_detection needed).
bool panoptic_wants_detections(const std::set<std::string>& outputs);

/// Inputs and outputs as ModelMetadata reports them (batch dimension -1).
std::vector<api::TensorMetadata> panoptic_output_metadata(int64_t num_queries, int64_t num_labels);

}  // namespace libreyolo::server
