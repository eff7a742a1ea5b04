// BERT's WordPiece tokenizer (bert-base-uncased: Grounding DINO, MM Grounding DINO), as
// transformers 5.17's BertTokenizer builds it on the `tokenizers` library
// (transformers/models/bert/tokenization_bert.py): BertNormalizer, BertPreTokenizer, WordPiece
// with '##' continuation, TemplateProcessing "[CLS] $A [SEP]".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/text/tokenizer.h"
#include "models/text/tokenizer_files.h"

namespace libreyolo::models::text {

class BertTokenizer : public Tokenizer {
 public:
  /// Loads a Hub folder: the vocabulary from tokenizer.json's model.vocab when the file is
  /// present (model.type WordPiece), else from vocab.txt (one token a line, id = line index);
  /// the options and special tokens from tokenizer_config.json (do_lower_case true,
  /// strip_accents null = do_lower_case, tokenize_chinese_chars true, model_max_length,
  /// padding_side; [UNK] [SEP] [PAD] [CLS] [MASK]) as BertTokenizer.__init__ reads them.
  /// Throws core::ConfigError naming the file: missing vocabulary ("<dir>/vocab.txt: cannot
  /// open"), invalid JSON, a field of the wrong type, a special token not in the vocabulary.
  static BertTokenizer from_folder(const std::string& dir);

  /// The word pieces of `text` (no [CLS]/[SEP]), for inspection and tests.
  std::vector<std::string> tokenize(std::string_view text) const;

  /// The text of `ids` as transformers' decode(ids) (skip_special_tokens false): the
  /// `tokenizers` WordPiece decoder (tokens joined by spaces, a '##' piece glued to the one
  /// before it except at the start; its per-token cleanup " ." " ?" " !" " ," -> "." "?" "!" ","),
  /// then clean_up_tokenization when tokenizer_config.json's clean_up_tokenization_spaces is
  /// true. Grounding DINO's phrase labels (processing_grounding_dino.py). An id without a token
  /// decodes to nothing.
  std::string decode(const std::vector<std::int64_t>& ids) const;

 protected:
  void append_ids(std::u32string_view text, std::vector<std::int64_t>& ids) const override;

 private:
  /// BertNormalizer (tokenizers normalizers/bert.rs): clean_text (drop controls, whitespace to
  /// ' '), CJK ideographs surrounded by spaces, strip accents (NFD, drop marks), lower-case.
  std::u32string normalize(std::u32string_view text) const;
  /// Greedy longest-match-first WordPiece of one word (tokenizers models/wordpiece, transformers'
  /// WordpieceTokenizer): [UNK] for a word of more than 100 characters or with no split.
  void word_pieces(std::u32string_view word, std::vector<std::int64_t>& ids,
                   std::vector<std::string>* pieces) const;
  void run(std::u32string_view text, std::vector<std::int64_t>& ids,
           std::vector<std::string>* pieces) const;

  Vocabulary vocab_;
  std::vector<std::string> id_to_token_;  ///< the vocabulary and added tokens by id
  bool clean_up_spaces_ = false;
  std::int64_t unk_id_ = 0;
  std::string unk_token_;
  bool lowercase_ = true, strip_accents_ = true, chinese_chars_ = true;
  std::size_t max_token_chars_ = 1;  ///< the longest vocabulary entry, characters
  static constexpr std::size_t kMaxInputCharsPerWord = 100;
};

}  // namespace libreyolo::models::text
