#include "models/text/bert_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "models/core/config.h"
#include "models/text/unicode.h"

namespace libreyolo::models::text {

using core::ConfigError;

namespace {

// vocab.txt: one token a line, the line index its id (transformers' load_vocab: the text of the
// line without its newline; a token listed twice keeps its last index).
Vocabulary read_vocab_txt(const std::string& file) {
  const std::string text = read_text_file(file);
  Vocabulary vocab;
  std::int64_t index = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::size_t stop = end;
    if (stop > start && text[stop - 1] == '\r') --stop;  // Python's universal newlines
    vocab[text.substr(start, stop - start)] = index++;
    start = end + 1;
  }
  return vocab;
}

}  // namespace

BertTokenizer BertTokenizer::from_folder(const std::string& dir) {
  BertTokenizer t;
  const std::string config_file = dir + "/tokenizer_config.json";
  const nlohmann::json config = read_tokenizer_config(dir);
  const std::string json_file = dir + "/tokenizer.json";
  std::string vocab_file;
  nlohmann::json tokenizer_json;
  if (file_exists(json_file)) {
    vocab_file = json_file;
    tokenizer_json = core::read_json_file(json_file);
    const nlohmann::json& model = tokenizer_json_model(tokenizer_json, json_file, "WordPiece");
    t.vocab_ = vocabulary_object(model["vocab"], json_file, "field 'model.vocab'");
  } else {
    vocab_file = dir + "/vocab.txt";
    t.vocab_ = read_vocab_txt(vocab_file);
  }

  t.lowercase_ = config_bool(config, config_file, "do_lower_case", true);
  t.strip_accents_ = config_bool(config, config_file, "strip_accents", t.lowercase_);
  t.chinese_chars_ = config_bool(config, config_file, "tokenize_chinese_chars", true);
  t.model_max_length_ = config_model_max_length(config, config_file);
  t.pad_left_ = pad_left(config, config_file);

  // The special tokens are added tokens too: matched whole in the raw text.
  auto special = [&](const char* key, const char* fallback) {
    const std::string token = special_token(config, config_file, key, fallback);
    const std::int64_t id = special_token_id(t.vocab_, token, vocab_file, key);
    t.added_.add(token, id);
    return std::pair{token, id};
  };
  std::tie(t.unk_token_, t.unk_id_) = special("unk_token", "[UNK]");
  t.end_id_ = special("sep_token", "[SEP]").second;
  t.pad_id_ = special("pad_token", "[PAD]").second;
  t.begin_id_ = special("cls_token", "[CLS]").second;
  special("mask_token", "[MASK]");
  if (tokenizer_json.is_object()) add_json_added_tokens(tokenizer_json, json_file, t.added_);
  std::int64_t max_id = t.added_.max_id();
  for (const auto& [token, id] : t.vocab_) {
    max_id = std::max(max_id, id);
    std::size_t chars = 0;  // an upper bound: '##' counted too
    for (std::size_t i = 0; i < token.size(); ++i)
      chars += (static_cast<unsigned char>(token[i]) & 0xC0) != 0x80;
    t.max_token_chars_ = std::max(t.max_token_chars_, chars);
  }
  t.vocab_size_ = max_id + 1;
  t.clean_up_spaces_ = config_bool(config, config_file, "clean_up_tokenization_spaces", false);
  t.id_to_token_.resize(static_cast<std::size_t>(t.vocab_size_));
  for (const auto& [token, id] : t.vocab_) t.id_to_token_[static_cast<std::size_t>(id)] = token;
  for (const auto& [token, id] : t.added_.tokens())
    t.id_to_token_[static_cast<std::size_t>(id)] = token;
  return t;
}

namespace {

/// Replaces every occurrence of `from` in `s` by `to`, left to right (Python str.replace).
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t start = 0, at = 0;
  while ((at = s.find(from, start)) != std::string::npos) {
    out.append(s, start, at - start).append(to);
    start = at + from.size();
  }
  s = out.append(s, start, std::string::npos);
}

}  // namespace

std::string BertTokenizer::decode(const std::vector<std::int64_t>& ids) const {
  std::string out;
  bool first = true;
  for (const auto id : ids) {
    if (id < 0 || id >= static_cast<std::int64_t>(id_to_token_.size())) continue;
    std::string token = id_to_token_[static_cast<std::size_t>(id)];
    // tokenizers decoders/wordpiece.rs: prefix stripped or a space added, then its cleanup
    // (decoders/wordpiece.rs `cleanup`) on the token.
    if (!first) token = token.rfind("##", 0) == 0 ? token.substr(2) : " " + token;
    first = false;
    static const std::pair<const char*, const char*> kTokenRules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kTokenRules) replace_all(token, from, to);
    out += token;
  }
  if (clean_up_spaces_) {
    // transformers PreTrainedTokenizerBase.clean_up_tokenization, on the whole text.
    static const std::pair<const char*, const char*> kTextRules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kTextRules) replace_all(out, from, to);
  }
  return out;
}

std::u32string BertTokenizer::normalize(std::u32string_view text) const {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) {
    if (is_bert_removed(cp)) continue;
    if (is_bert_space(cp)) {
      out += U' ';
    } else if (chinese_chars_ && is_cjk(cp)) {
      out += U' ';
      out += cp;
      out += U' ';
    } else {
      out += cp;
    }
  }
  if (strip_accents_) {
    std::u32string stripped;
    for (char32_t cp : nfd(out))
      if (!is_mark(cp)) stripped += cp;
    out = std::move(stripped);
  }
  if (lowercase_) out = lowercase(out);
  return out;
}

void BertTokenizer::word_pieces(std::u32string_view word, std::vector<std::int64_t>& ids,
                                std::vector<std::string>* pieces) const {
  if (word.size() > kMaxInputCharsPerWord) {
    ids.push_back(unk_id_);
    if (pieces) pieces->push_back(unk_token_);
    return;
  }
  std::string utf8;
  std::vector<std::size_t> offset;  // byte offset of each character, and the end
  for (char32_t cp : word) {
    offset.push_back(utf8.size());
    append_utf8(utf8, cp);
  }
  offset.push_back(utf8.size());
  std::vector<std::int64_t> word_ids;
  std::vector<std::string> word_pieces;
  std::size_t start = 0;
  while (start < word.size()) {
    // Longest match first; no vocabulary entry is longer than max_token_chars_ characters.
    std::size_t end = std::min(word.size(), start + max_token_chars_);
    std::int64_t id = -1;
    std::string piece;
    for (; end > start; --end) {
      piece = (start > 0 ? "##" : "") + utf8.substr(offset[start], offset[end] - offset[start]);
      const auto it = vocab_.find(piece);
      if (it != vocab_.end()) {
        id = it->second;
        break;
      }
    }
    if (id < 0) {  // no split: the whole word is unknown
      word_ids.assign(1, unk_id_);
      word_pieces.assign(1, unk_token_);
      break;
    }
    word_ids.push_back(id);
    word_pieces.push_back(std::move(piece));
    start = end;
  }
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (pieces) pieces->insert(pieces->end(), word_pieces.begin(), word_pieces.end());
}

void BertTokenizer::run(std::u32string_view text, std::vector<std::int64_t>& ids,
                        std::vector<std::string>* pieces) const {
  // BertPreTokenizer (tokenizers pre_tokenizers/bert.rs): split on whitespace (removed), then
  // each punctuation character is a word of its own.
  const std::u32string normalized = normalize(text);
  std::size_t word_start = 0;
  for (std::size_t i = 0; i <= normalized.size(); ++i) {
    const bool end = i == normalized.size();
    const bool space = !end && is_bert_whitespace(normalized[i]);
    const bool punct = !end && !space && is_bert_punctuation(normalized[i]);
    if (end || space || punct) {
      if (i > word_start)
        word_pieces(std::u32string_view(normalized).substr(word_start, i - word_start), ids,
                    pieces);
      if (punct) word_pieces(std::u32string_view(normalized).substr(i, 1), ids, pieces);
      word_start = i + 1;
    }
  }
}

void BertTokenizer::append_ids(std::u32string_view text, std::vector<std::int64_t>& ids) const {
  run(text, ids, nullptr);
}

std::vector<std::string> BertTokenizer::tokenize(std::string_view text) const {
  decode_utf8(text);  // the whole text's validity first, so that the offset is the text's
  std::vector<std::string> pieces;
  std::vector<std::int64_t> ids;
  for (const auto& [piece, id] : added_.split(text)) {
    if (id >= 0) {
      pieces.emplace_back(piece);
    } else {
      run(decode_utf8(piece), ids, &pieces);
    }
  }
  return pieces;
}

}  // namespace libreyolo::models::text
