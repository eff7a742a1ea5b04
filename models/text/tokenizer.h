// What the text tokenizers of models/text/ share: the encoding of one text (ids and attention
// mask), the special tokens matched in the raw text, truncation and padding (transformers'
// PreTrainedTokenizerBase.__call__ with truncation=True, and the `tokenizers` library's
// AddedVocabulary and TemplateProcessing / RobertaProcessing for single sequences).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace libreyolo::models::text {

/// One encoded text: input_ids and attention_mask (1 for a token, 0 for padding), same length.
struct Encoding {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> attention_mask;
};

/// transformers' padding argument: none, to the longest of the batch, to max_length.
enum class Padding { kNone, kLongest, kMaxLength };

/// The added (special) tokens of a tokenizer, matched in the raw text before normalisation
/// (tokenizers' AddedVocabulary with normalized=false, lstrip/rstrip/single_word false, as the
/// BERT and CLIP tokenizer.json files have them): leftmost, then longest match.
class AddedTokens {
 public:
  void add(std::string content, std::int64_t id);
  /// The text cut into pieces: (text, -1) for a run to tokenize, (token, id) for an added token.
  std::vector<std::pair<std::string_view, std::int64_t>> split(std::string_view text) const;
  std::int64_t max_id() const;
  /// (content, id) of every added token, in the order added.
  const std::vector<std::pair<std::string, std::int64_t>>& tokens() const { return tokens_; }

 private:
  std::vector<std::pair<std::string, std::int64_t>> tokens_;
};

/// A tokenizer that frames a text as <begin> tokens <end> (BERT: [CLS] ... [SEP], CLIP:
/// <|startoftext|> ... <|endoftext|>), truncates and pads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// The ids of `text` without the begin/end tokens, untruncated. Throws std::invalid_argument
  /// for text that is not UTF-8 ("text: invalid UTF-8 at byte <offset>").
  std::vector<std::int64_t> content_ids(std::string_view text) const;
  /// begin + content (truncated to max_length - 2) + end, attention mask all ones. max_length 0
  /// takes model_max_length() (0 there: no truncation). Throws std::invalid_argument for a
  /// max_length below 2.
  Encoding encode(std::string_view text, std::int64_t max_length = 0) const;
  /// encode for each text, then padding with pad_id() on the side tokenizer_config.json names
  /// (right unless padding_side is "left"). kMaxLength needs a max_length (argument or
  /// model_max_length; std::invalid_argument otherwise).
  std::vector<Encoding> encode_batch(const std::vector<std::string>& texts, Padding padding,
                                     std::int64_t max_length = 0) const;

  /// tokenizer_config.json's model_max_length (0 when absent or beyond 1e9, transformers'
  /// VERY_LARGE_INTEGER).
  std::int64_t model_max_length() const { return model_max_length_; }
  /// One more than the largest id of the vocabulary and the added tokens.
  std::int64_t vocab_size() const { return vocab_size_; }
  std::int64_t begin_id() const { return begin_id_; }
  std::int64_t end_id() const { return end_id_; }
  std::int64_t pad_id() const { return pad_id_; }

 protected:
  /// Appends the ids of one run of text between added tokens (normalised, pre-tokenised, model).
  virtual void append_ids(std::u32string_view text, std::vector<std::int64_t>& ids) const = 0;

  AddedTokens added_;
  std::int64_t model_max_length_ = 0, vocab_size_ = 0;
  std::int64_t begin_id_ = 0, end_id_ = 0, pad_id_ = 0;
  bool pad_left_ = false;
};

}  // namespace libreyolo::models::text
