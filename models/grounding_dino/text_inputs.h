// Grounding DINO's text side of the processor and model inputs (transformers 5.17
// processing_grounding_dino.py, modeling_grounding_dino.py): prompts in the "a cat. a remote
// control." form or as a list of labels, their BERT token tensors, and the per-phrase
// self-attention mask and position ids the model derives from the ids.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/text/bert_tokenizer.h"

namespace libreyolo::models::grounding_dino {

/// bert-base-uncased's [CLS], [SEP], '.' and '?' ids: the phrase delimiters upstream hard-codes
/// (SPECIAL_TOKENS), whatever the checkpoint's vocabulary.
inline constexpr int64_t kSpecialTokens[] = {101, 102, 1012, 1029};

/// GroundingDinoProcessor._preprocess_input_text for one image's list of candidate labels:
/// ". ".join(label.strip().lower()) + "." ("a cat. a dog."); a single prompt string is used as
/// it is. Lower-casing and stripping are ASCII-only (the uncased tokenizer lower-cases the rest
/// itself). Throws std::invalid_argument for no label or a label containing '.' (upstream
/// would then read the list as a batch of prompts).
std::string merge_labels(const std::vector<std::string>& labels);

/// The processor's text tensors for a batch of prompts, padded to the longest (right):
/// input_ids, attention_mask (1 = token) and token_type_ids (zeros), each (B, L) int64 on CPU.
struct TextTensors {
  at::Tensor input_ids, attention_mask, token_type_ids;
};

/// Tokenizes one prompt per image ([CLS] ... [SEP], no truncation: the model truncates at
/// max_text_len as upstream). Throws std::invalid_argument for an empty batch or a prompt that
/// is not UTF-8 ("text: invalid UTF-8 at byte <offset>").
TextTensors encode_prompts(const text::BertTokenizer& tokenizer,
                           const std::vector<std::string>& prompts);

/// generate_masks_with_special_tokens_and_transfer_map: input_ids (B, L) int64 ->
/// (mask (B, L, L) bool: tokens attend within their phrase, delimited by kSpecialTokens, plus
/// themselves; position_ids (B, L) int64: the index within the phrase, 0 outside phrases).
std::pair<at::Tensor, at::Tensor> phrase_masks(const at::Tensor& input_ids);

}  // namespace libreyolo::models::grounding_dino
