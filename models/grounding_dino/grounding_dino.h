// Grounding DINO (Liu et al., "Grounding DINO: Marrying DINO with Grounded Pre-Training for
// Open-Set Object Detection", ECCV 2024) and MM Grounding DINO as transformers 5.17
// GroundingDinoForObjectDetection / MMGroundingDinoForObjectDetection: the text-conditioned
// entry point that the loaded model offers besides models::Model.
#pragma once

#include <ATen/ATen.h>

#include "models/grounding_dino/text_inputs.h"
#include "models/model.h"
#include "models/text/bert_tokenizer.h"

namespace libreyolo::models::grounding_dino {

/// What load_model returns for model_type "grounding-dino" / "mm-grounding-dino" implements this
/// too (dynamic_cast the Model). Model::forward without text throws std::invalid_argument.
class TextConditioned {
 public:
  virtual ~TextConditioned() = default;

  /// pixel_values (B, 3, H, W) float (processor output), pixel_mask (B, H, W) integer/bool
  /// (1 = real pixel) or undefined; text.input_ids (B, L) int64 (B equal to the images'; ids
  /// past max_text_len are dropped as upstream), attention_mask (B, L) (1 = token; undefined:
  /// all ones), token_type_ids (B, L) or undefined (zeros). Returns logits (B, num_queries,
  /// max_text_len) float32 (-inf past each prompt's tokens: contrastive scores of the queries
  /// with the text tokens) and pred_boxes (B, num_queries, 4) normalised (cx, cy, w, h).
  /// Throws std::invalid_argument naming the tensor for bad shapes, dtypes or ids, or an input
  /// with fewer encoder tokens than num_queries.
  virtual ModelOutput forward_text(const at::Tensor& pixel_values, const at::Tensor& pixel_mask,
                                   const TextTensors& text) const = 0;

  /// The folder's tokenizer (tokenizer.json or vocab.txt, tokenizer_config.json).
  virtual const text::BertTokenizer& tokenizer() const = 0;
  /// config.json max_text_len: the logits' last dimension.
  virtual int64_t max_text_len() const = 0;
};

}  // namespace libreyolo::models::grounding_dino
