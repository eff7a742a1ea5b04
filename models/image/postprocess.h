// Post-processing of raw model outputs: transformers 5.17
// RTDetrImageProcessor.post_process_object_detection (use_focal_loss=True path),
// DeformableDetrImageProcessor.post_process_object_detection, and softmax top-k for classifiers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::image {

/// Which post-processor a detector uses (each detector family names its own in its
/// registration record, models/registry/family.h Family::head).
enum class DetectionHead {
  /// RTDetrImageProcessor's (RT-DETR, RT-DETRv2, D-FINE, DEIMv2) and RfDetrImageProcessor's:
  /// top-k = num_queries over Q*C, sigmoid, the boxes gathered then scaled
  rt_detr,
  /// DeformableDetrImageProcessor's (Deformable DETR, LW-DETR) and ConditionalDetrImageProcessor's
  /// (Conditional DETR, DAB-DETR: transformers 5.17 modular_conditional_detr.py, the same code):
  /// top-k = min(top_k (100), Q*C)
  deformable_detr,
  /// DetrImageProcessor's (DETR; transformers 5.17 models/detr/image_processing_detr.py
  /// post_process_object_detection): softmax over the last dimension, score and label = the
  /// best class but the last ("no object"), kept where score > threshold, in query order; no
  /// top-k upstream. PostProcessOptions::top_k <= 0 (the default) keeps that exactly; top_k > 0
  /// keeps the top_k best-scored queries (at::topk, descending score; all Q when top_k >= Q).
  detr,
  /// PPDocLayoutV3ImageProcessor's (models/image/document_layout.h: top-k = Q over Q*C, sigmoid,
  /// kept where score >= threshold, in reading order). post_process_object_detection treats it
  /// as rt_detr's (no reading order: that needs the order logits).
  pp_doclayout,
  /// PPDocLayoutV2ImageProcessor's: pp_doclayout's without masks (the model returns none).
  pp_doclayout_v2,
  /// Open-vocabulary (text-prompted) detectors (OWL-ViT, OWLv2: models/prompted.h): their
  /// PromptedDetector::post_process, which needs the prompts; post_process_object_detection
  /// refuses it (std::invalid_argument).
  prompted,
};

struct PostProcessOptions {
  /// Keep `score > threshold` (strict, compared in float32 as torch does).
  double threshold = 0.5;
  /// Candidates before thresholding; <= 0 means the family default (RT-DETR: num_queries,
  /// Deformable DETR: 100, DETR: every query in query order); always capped at Q * num_classes
  /// (DETR: at Q, one candidate per query).
  int64_t top_k = 0;
  /// RT-DETR `use_focal_loss` (config.json, default true): sigmoid scores. False: softmax over
  /// the classes minus the last ("no object") and the best class per query (transformers' call
  /// omits `dim`; this uses the intended last dimension).
  bool use_focal_loss = true;
};

/// Detections of one image, sorted by descending score (torch.topk order); DetectionHead::detr
/// without top_k: in query order, as transformers returns them.
struct Detections {
  at::Tensor scores;  ///< (K) float32
  at::Tensor labels;  ///< (K) int64 class index (id2label key)
  at::Tensor boxes;   ///< (K, 4) float32 x0, y0, x1, y1; original-image pixels when target sizes
                      ///< were given, else normalised [0, 1]
};

/// logits (B, Q, C) float (sigmoid-style, no background class), pred_boxes (B, Q, 4)
/// (cx, cy, w, h) normalised; target_sizes: empty, or B pairs (height, width) in pixels.
/// Works on the tensors' device; results are on the same device.
/// Throws std::invalid_argument for mismatched shapes / target_sizes count.
std::vector<Detections> post_process_object_detection(
    const at::Tensor& logits, const at::Tensor& pred_boxes,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, DetectionHead head,
    const PostProcessOptions& options = {});

/// Classifier top-k: softmax over the last dimension of logits (B, C) (float32), then topk.
struct Classifications {
  at::Tensor probabilities;  ///< (B, C) float32
  at::Tensor scores;         ///< (B, K) float32, descending
  at::Tensor labels;         ///< (B, K) int64
};

/// k is capped at C; k <= 0 means 5. Throws std::invalid_argument unless logits is 2-D.
Classifications classify(const at::Tensor& logits, int64_t k = 5);

/// id2label[id], or "LABEL_<id>" (transformers' default name) when absent.
std::string label_name(const std::map<int64_t, std::string>& id2label, int64_t id);

}  // namespace libreyolo::image
