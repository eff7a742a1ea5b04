// CLIP's byte-level BPE tokenizer (OWL-ViT, OWLv2, OmDet-Turbo), as transformers 5.17's
// CLIPTokenizer builds it on the `tokenizers` library (transformers/models/clip/
// tokenization_clip.py): normalizers NFC, Replace(\s+ -> " "), Lowercase; pre-tokenizers
// Split(CLIP's regex, removed, inverted) then ByteLevel (GPT-2's regex, byte-to-unicode); BPE
// with end_of_word_suffix "</w>"; RobertaProcessing "<|startoftext|> $A <|endoftext|>".
// 5.17 has no pure-Python CLIP tokenizer (the one before used ftfy when installed); this is the
// `tokenizers` pipeline, which applies no ftfy fix-ups.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/text/tokenizer.h"
#include "models/text/tokenizer_files.h"

namespace libreyolo::models::text {

class ClipTokenizer : public Tokenizer {
 public:
  /// Loads a Hub folder: vocabulary and merges from tokenizer.json's model (type BPE; merges as
  /// "a b" strings or [a, b] pairs) when the file is present, else vocab.json and merges.txt
  /// (a "#version" line skipped, each other line "a b"); unk/bos/eos/pad tokens
  /// (<|endoftext|>, <|startoftext|>, <|endoftext|>, <|endoftext|>), model_max_length and
  /// padding_side from tokenizer_config.json (OWL-ViT's pad_token is "!").
  /// Throws core::ConfigError naming the file: "<dir>/vocab.json: cannot open", "<dir>/vocab.json:
  /// expected a JSON object of token -> id, found array", "<dir>/merges.txt:3: expected two
  /// symbols separated by one space, found 'abc'", "<dir>/merges.txt:3: merge 'a b': 'ab' is not
  /// in the vocabulary", a special token not in the vocabulary.
  static ClipTokenizer from_folder(const std::string& dir);

  /// The BPE tokens of `text` (no start/end tokens; byte-level symbols, '</w>' on word ends).
  std::vector<std::string> tokenize(std::string_view text) const;

 protected:
  void append_ids(std::u32string_view text, std::vector<std::int64_t>& ids) const override;

 private:
  /// BPE of one pre-token's byte-level symbols (tokenizers models/bpe/word.rs merge_all): the
  /// adjacent pair of lowest merge rank merges first (leftmost among equals), O(n log n).
  void bpe(const std::string& bytes, std::vector<std::int64_t>& ids) const;
  void run(std::u32string_view text, std::vector<std::int64_t>& ids) const;

  Vocabulary vocab_;
  std::vector<std::string> token_of_id_;
  /// (left id, right id) -> (rank, merged id).
  std::map<std::pair<std::int64_t, std::int64_t>, std::pair<std::int64_t, std::int64_t>> merges_;
  std::int64_t unk_id_ = 0;
  /// Byte -> its symbol (GPT-2/CLIP bytes_to_unicode), UTF-8; and the same with "</w>", as ids.
  std::string byte_symbol_[256];
};

}  // namespace libreyolo::models::text
