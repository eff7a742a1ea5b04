// The query selection the DETR post-processors share (transformers 5.17: RTDetrImageProcessor /
// RfDetrImageProcessor post_process_*: torch.topk over sigmoid(logits) flattened to Q * C), and
// their box conversion. Internal to models/image (post-processing), no public API.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace libreyolo::image {

/// The k best (query, class) pairs per image, descending (torch.topk order).
struct QuerySelection {
  at::Tensor scores;  ///< (B, k) float32 sigmoid probabilities
  at::Tensor labels;  ///< (B, k) int64 class index
  at::Tensor query;   ///< (B, k) int64 query index
};

/// logits (B, Q, C) float32; k in 1..Q*C.
QuerySelection sigmoid_topk(const at::Tensor& logits, int64_t k);

/// transformers image_transforms._center_to_corners_format_torch: (..., 4) cx, cy, w, h ->
/// x0, y0, x1, y1.
at::Tensor center_to_corners(const at::Tensor& boxes);

/// (B, 4) float32 (w, h, w, h) on `device`, from B (height, width) pairs in pixels.
at::Tensor scale_factors(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                         const at::Device& device);

}  // namespace libreyolo::image
