// OmDetTurboProcessor.post_process_grounded_object_detection (transformers 5.17
// models/omdet_turbo/processing_omdet_turbo.py): the best (box, class) pairs by sigmoid score,
// a score threshold, the image's own classes only, per-class NMS (torchvision batched_nms), boxes
// clipped to the image.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"

namespace libreyolo::models::omdet_turbo {

/// torchvision.ops.batched_nms on CPU (its coordinate trick: each label's boxes offset by
/// label * (max coordinate + 1), then nms): boxes (K, 4) x0 y0 x1 y1 float32, scores (K),
/// labels (K) int64 -> the kept indices (int64) by decreasing score; a box is suppressed by a
/// kept one of higher score with IoU > iou_threshold. Works on any device (computes on the CPU).
at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& labels,
                       double iou_threshold);

/// logits (B, Q, C) (C = the batch's most classes; an image's own are the first num_classes[b]),
/// pred_boxes (B, Q, 4) sigmoid (cx, cy, w, h), target_sizes (height, width) per image.
/// Per image, as upstream with max_num_det None: the Q best of the Q * C sigmoid scores, kept
/// when > threshold and of a class < num_classes[b], batched_nms at nms_threshold, boxes scaled
/// to the target size and clipped to it. Results by decreasing score: scores (K) float32, labels
/// (K) int64 (the class index), boxes (K, 4) float32 pixels, on the CPU. Throws
/// std::invalid_argument for mismatched batch sizes.
std::vector<image::Detections> post_process_grounded_object_detection(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const std::vector<int64_t>& num_classes,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, double threshold,
    double nms_threshold);

}  // namespace libreyolo::models::omdet_turbo
