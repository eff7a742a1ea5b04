// The query selection the DETR post-processors share (transformers 5.17: RTDetrImageProcessor /
// RfDetrImageProcessor post_process_*: torch.topk over sigmoid(logits) flattened to Q * C), and
// their box conversion. Internal to models/image (post-processing), no public API.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"

namespace libreyolo::image {

/// The k best (query, class) pairs per image, descending (torch.topk order).
struct QuerySelection {
  at::Tensor scores;  ///< (B, k) float32 sigmoid probabilities
  at::Tensor labels;  ///< (B, k) int64 class index
  at::Tensor query;   ///< (B, k) int64 query index
};

/// logits (B, Q, C) float32; k in 1..Q*C.
QuerySelection sigmoid_topk(const at::Tensor& logits, int64_t k);

/// One image's detections of a sigmoid top-k head (post_process_object_detection on the CPU)
/// without the top-k, where that is the same answer: a score above the threshold outranks every
/// other, so when at most k scores are above it or NaN (torch.topk ranks NaN first), the kept
/// detections are exactly those scores, and sorted by descending score they are in torch.topk's
/// order when no two of them are equal (equal scores leave the order to topk's partial sort).
/// std::nullopt otherwise: the caller runs at::topk. Scores and boxes take the ATen path's
/// float32 operations in its order (sigmoid is the caller's ATen call; this file is built
/// without FMA contraction, models/CMakeLists.txt), so the values are the same bits. A real
/// detector's outputs hold a few dozen such scores among Q * C (24,000 for RT-DETR on COCO),
/// and the full top-k was most of a request's answer time on the CPU (tools/bench_preprocess,
/// BM_PostProcess). prob: (Q * C) sigmoid scores; boxes: (Q, 4) cx, cy, w, h; scale: (4) w, h,
/// w, h or null. Detections on the CPU: scores (K) float32, labels (K) int64, boxes (K, 4).
std::optional<Detections> detections_above(const float* prob, int64_t q, int64_t c, int64_t k,
                                           float threshold, const float* boxes, const float* scale);

/// transformers image_transforms._center_to_corners_format_torch: (..., 4) cx, cy, w, h ->
/// x0, y0, x1, y1.
at::Tensor center_to_corners(const at::Tensor& boxes);

/// (B, 4) float32 (w, h, w, h) on `device`, from B (height, width) pairs in pixels.
at::Tensor scale_factors(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                         const at::Device& device);

}  // namespace libreyolo::image
