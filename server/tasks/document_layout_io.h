// Document-layout I/O of ModelInfer (PP-DocLayoutV2 and V3; DESIGN.md "Serving"): the
// detector's inputs and outputs (detector_io.h) with the detections of each image in reading
// order (PPDocLayoutV3ImageProcessor.post_process_object_detection, V2's without masks,
// models/image/document_layout.h: kept where score >= `threshold`; upstream has no top_k, so
// `top_k` is not applied), plus
// - `reading_order` INT64 [N,K]: each kept detection's rank among the model's Q queries
//   (upstream's order_seq; ascending along K), -1 for the K - k_i padding entries;
// - PP-DocLayoutV3 only, on request: `masks` UINT8 [N,K,h,w] (1 where sigmoid(mask logit) >
//   threshold, at the model's mask resolution h x w = the processed image's H/4 x W/4, stretched
//   over the whole image like the boxes' normalised coordinates; upstream turns these into
//   polygon_points with OpenCV, not reproduced) or `rle_counts` / `rle_size` (COCO RLE of the
//   same masks, segmentation_io.h).
#pragma once

#include <memory>

#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

/// The adapter of a model whose description's head is image::DetectionHead::pp_doclayout (with
/// masks) or pp_doclayout_v2 (without: requesting masks is an unknown output).
std::unique_ptr<TaskAdapter> make_document_layout_task(const models::ModelDescription& d,
                                                       std::map<int64_t, std::string> labels,
                                                       const ServingConfig& serving);

}  // namespace libreyolo::server
