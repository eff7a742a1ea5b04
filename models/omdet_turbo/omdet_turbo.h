// OmDet-Turbo (Zhao et al., "Real-time Transformer-based Open-Vocabulary Detection with
// Efficient Fusion Head", 2024) as transformers 5.17 OmDetTurboForObjectDetection: the
// text-conditioned entry point that the loaded model offers besides models::Model and
// models::PromptedDetector.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/model.h"

namespace libreyolo::models::omdet_turbo {

/// A batch's text side as OmDetTurboProcessor makes it (every row padded / truncated to 77
/// tokens: <|startoftext|> content <|endoftext|> then the tokenizer's pad id).
struct TextInputs {
  at::Tensor classes_input_ids;     ///< (N, 77) int64: every image's classes, image by image
  at::Tensor classes_structure;     ///< (B) int64: how many of those rows each image has
  at::Tensor tasks_input_ids;       ///< (B, 77) int64: one task sentence per image
  at::Tensor tasks_attention_mask;  ///< (B, 77) int64: 1 on the task's tokens
};

/// The default task of one image's classes, as OmDetTurboProcessor builds it when `task` is not
/// given: "Detect " + the classes joined by ", " + "." ("Detect cat, remote.").
std::string default_task(const std::vector<std::string>& classes);

/// What load_model returns for model_type "omdet-turbo" implements this too (dynamic_cast the
/// Model). Model::forward without text throws std::invalid_argument.
class TaskConditioned {
 public:
  virtual ~TaskConditioned() = default;

  /// Tokenizes as OmDetTurboProcessor(text=classes, task=tasks): tasks[b] "" takes
  /// default_task(classes[b]). Tensors on the CPU. Throws std::invalid_argument for an image
  /// without classes, a tasks count other than the images', or text that is not UTF-8
  /// ("classes[b][i]: text: invalid UTF-8 at byte k", "tasks[b]: ...").
  virtual TextInputs encode(const std::vector<std::vector<std::string>>& classes,
                            const std::vector<std::string>& tasks) const = 0;

  /// pixel_values (B, 3, H, W) float (processor output) and `text` for the same B images ->
  /// logits (B, num_queries, max classes) float32 (decoder_class_logits: columns past an
  /// image's classes hold the scores of its zero padding classes, as upstream) and pred_boxes
  /// (B, num_queries, 4) sigmoid (cx, cy, w, h) (decoder_coord_logits). Throws
  /// std::invalid_argument naming the tensor for bad shapes or dtypes.
  virtual ModelOutput forward_text(const at::Tensor& pixel_values,
                                   const TextInputs& text) const = 0;
};

}  // namespace libreyolo::models::omdet_turbo
