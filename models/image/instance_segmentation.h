// Instance segmentation post-processing: transformers 5.17
// RfDetrImageProcessor.post_process_instance_segmentation with return_binary_maps=True (one
// binary mask per instance, no overlap resolution: what the original rfdetr package returns),
// plus each instance's box from the same query (post_process_object_detection's boxes), and
// COCO's uncompressed run-length encoding of a mask.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "models/image/postprocess.h"

namespace libreyolo::image {

struct InstanceSegmentationOptions {
  /// Keep `score > threshold` (float32 comparison, as torch does).
  double threshold = 0.5;
  /// A pixel belongs to the instance when its resized mask logit is > mask_threshold.
  double mask_threshold = 0.0;
  /// Candidates before thresholding; <= 0 means Q (upstream's default); capped at Q * C.
  int64_t top_k = 0;
  /// > 0: the instances kept above `threshold` may make at most this many mask pixels
  /// (sum over the images of K x H x W, before empty masks are dropped); more throws
  /// std::length_error before any mask is resized (a server's bound on a request's memory).
  int64_t max_mask_pixels = 0;
};

/// The instances of one image, descending score. An instance whose mask is empty after
/// thresholding is dropped (as upstream does), so K <= the detections above `threshold`.
struct InstanceMasks {
  Detections detections;  ///< scores (K), labels (K), boxes (K, 4) x0, y0, x1, y1: target pixels
                          ///< when target sizes were given, else normalised [0, 1]
  at::Tensor masks;       ///< (K, H, W) bool at the target size (else the masks' h, w)
};

/// logits (B, Q, C) (sigmoid scores), pred_boxes (B, Q, 4) (cx, cy, w, h normalised),
/// pred_masks (B, Q, h, w) mask logits; target_sizes: empty or B (height, width) pairs, pixels.
/// Masks are resized with bilinear interpolation (align_corners=False) in float32, as
/// F.interpolate is upstream, a few instances at a time (bounded float32 temporaries). Works on
/// the tensors' device. Throws std::invalid_argument for mismatched shapes, a target_sizes
/// count other than B, or no queries; std::length_error "post_process_instance_segmentation: K
/// instances make P mask pixels, above the limit of M" past options.max_mask_pixels.
std::vector<InstanceMasks> post_process_instance_segmentation(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const at::Tensor& pred_masks,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    const InstanceSegmentationOptions& options = {});

/// COCO uncompressed RLE `counts` of a (H, W) mask (bool or uint8, any device): run lengths in
/// column-major order (pycocotools' Fortran order), the first run counting zeros (0 when the
/// first pixel is set); they sum to H * W. Throws std::invalid_argument unless mask is 2-D.
std::vector<int64_t> coco_rle_counts(const at::Tensor& mask);

}  // namespace libreyolo::image
