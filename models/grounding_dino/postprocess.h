// GroundingDinoProcessor.post_process_grounded_object_detection (transformers 5.17
// processing_grounding_dino.py): boxes kept by their best token probability, labelled with the
// phrase of the tokens above text_threshold.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "models/text/bert_tokenizer.h"

namespace libreyolo::models::grounding_dino {

/// One image's detections, in query order.
struct GroundedDetections {
  at::Tensor scores;                 ///< (N) float32: max over tokens of sigmoid(logits)
  at::Tensor boxes;                  ///< (N, 4) float32 (x0, y0, x1, y1), pixels of target_size
  std::vector<std::string> phrases;  ///< decoded tokens with probability > text_threshold
};

/// logits (B, Q, T) (T = max_text_len; -inf past the prompt), pred_boxes (B, Q, 4) normalised
/// (cx, cy, w, h), input_ids (B, L) the prompt ids (L <= T), target_sizes (height, width) per
/// image (empty: boxes stay normalised). A query is kept when its score > box_threshold; its
/// phrase is tokenizer.decode of the ids at positions 1..T-2 whose probability >
/// text_threshold (get_phrases_from_posmap: the first and last positions never count).
/// Throws std::invalid_argument on shape mismatches (naming the tensor).
std::vector<GroundedDetections> post_process_grounded_object_detection(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const at::Tensor& input_ids,
    double box_threshold, double text_threshold,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    const text::BertTokenizer& tokenizer);

}  // namespace libreyolo::models::grounding_dino
