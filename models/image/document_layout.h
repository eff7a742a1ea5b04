// Document-layout post-processing: transformers 5.17 PPDocLayoutV3ImageProcessor
// (image_processing_pp_doclayout_v3.py) _get_order_seqs and post_process_object_detection:
// detections in reading order with their binary masks. Upstream also turns each mask into a
// polygon with OpenCV (cv2.findContours / approxPolyDP, polygon_points); that step is not
// reproduced: the masks themselves are returned.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"

namespace libreyolo::image {

/// _get_order_seqs: order_logits (B, Q, Q) -> (B, Q) int64, each query's reading-order rank:
/// votes_j = sum_{i<j} sigmoid(l_ij) + sum_{i>j} (1 - sigmoid(l_ji)), rank = position of j in
/// argsort(votes) (torch.argsort, not stable: ties as ATen's sort orders them).
/// Throws std::invalid_argument unless order_logits is (B, Q, Q).
at::Tensor reading_order(const at::Tensor& order_logits);

/// The detections of one page, in reading order (ascending `order`).
struct DocumentLayout {
  Detections detections;  ///< scores (K), labels (K), boxes (K, 4) x0, y0, x1, y1 (target pixels
                          ///< when target sizes were given, else normalised)
  at::Tensor order;       ///< (K) int64 reading-order ranks among all Q queries, ascending
  at::Tensor masks;       ///< (K, h, w) bool: sigmoid(mask logit) > threshold, mask resolution
};

/// PPDocLayoutV3ImageProcessor.post_process_object_detection: sigmoid scores, top-k = Q over
/// Q * C (labels = index % C), boxes cxcywh -> corners scaled by target (height, width), masks
/// and ranks gathered per candidate, kept where score >= threshold (float32, >= as upstream),
/// then sorted by rank (torch.sort). logits (B, Q, C), pred_boxes (B, Q, 4), order_logits
/// (B, Q, Q), pred_masks (B, Q, h, w) (undefined: no masks); target_sizes empty or B pairs.
/// Works on the tensors' device. Throws std::invalid_argument for mismatched shapes or counts.
std::vector<DocumentLayout> post_process_document_layout(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const at::Tensor& order_logits,
    const at::Tensor& pred_masks, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    double threshold = 0.5);

}  // namespace libreyolo::image
