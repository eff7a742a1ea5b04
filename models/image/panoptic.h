// Panoptic segmentation post-processing: transformers 5.17 DetrImageProcessor.
// post_process_panoptic_segmentation (models/detr/image_processing_detr.py, with
// remove_low_and_no_objects, compute_segments and check_segment_validity), in float32.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace libreyolo::image {

/// One entry of an image's segments_info.
struct PanopticSegment {
  int64_t id = 0;          ///< the value of its pixels in the segmentation map (1, 2, ...)
  int64_t label_id = 0;    ///< the class (logits' index)
  bool was_fused = false;  ///< label_id is in label_ids_to_fuse (its instances share one id)
  double score = 0.0;      ///< the query's softmax score, rounded to 6 decimals as upstream
};

struct PanopticResult {
  /// (H, W) int32 segment ids: 0 where no segment won the pixel; all -1 when no query passed
  /// the threshold (upstream's "no mask found").
  at::Tensor segmentation;
  /// In query order. A fused label's later instances repeat its id (upstream appends one entry
  /// per kept query).
  std::vector<PanopticSegment> segments;
};

struct PanopticOptions {
  double threshold = 0.5;       ///< a query is kept when its best score (not "no object") > it
  double mask_threshold = 0.5;  ///< a pixel belongs to a query's mask when prob * score >= it
  /// A query's segment is kept when the pixels it wins / its mask's pixels > it.
  double overlap_mask_area_threshold = 0.8;
  std::set<int64_t> label_ids_to_fuse;  ///< labels whose instances share one segment id
};

/// logits (B, Q, C + 1: the last is "no object"), pred_masks (B, Q, h, w) mask logits, float32
/// on any device; target_sizes: per image (height, width) the map is bilinearly resized to
/// (upstream resizes the whole padded mask, padding included); empty: (h, w). Returns one
/// result per image (the map on the inputs' device). Throws std::invalid_argument "
/// post_process_panoptic_segmentation: ..." for shapes that do not fit, C < 1, or
/// target_sizes with another count than B or a non-positive side.
std::vector<PanopticResult> post_process_panoptic_segmentation(
    const at::Tensor& logits, const at::Tensor& pred_masks,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, const PanopticOptions& options);

}  // namespace libreyolo::image
