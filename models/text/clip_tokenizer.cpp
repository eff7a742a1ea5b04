#include "models/text/clip_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>

#include "models/core/config.h"
#include "models/text/unicode.h"

namespace libreyolo::models::text {

using core::ConfigError;

namespace {

// openai/CLIP simple_tokenizer.py bytes_to_unicode: the printable bytes stand for themselves,
// the others for U+0100 + n in byte order.
void byte_symbols(std::string (&symbol)[256]) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    symbol[b].clear();
    append_utf8(symbol[b], printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
  }
}

bool starts_with(std::u32string_view s, std::size_t i, std::u32string_view prefix) {
  return s.compare(i, prefix.size(), prefix) == 0;
}

// The end of the match at `i` of CLIP's pre-tokenizer regex (clip = true)
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// or, within its pieces, of GPT-2's (ByteLevel's use_regex; no whitespace is left by then)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Alternatives in order, the first that matches wins (Oniguruma); s[i] is not whitespace.
std::size_t match_end(std::u32string_view s, std::size_t i, bool clip) {
  if (clip) {
    for (std::u32string_view literal : {U"<|startoftext|>", U"<|endoftext|>"})
      if (starts_with(s, i, literal)) return i + literal.size();
  }
  for (std::u32string_view contraction : {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"})
    if (starts_with(s, i, contraction)) return i + contraction.size();
  std::size_t j = i;
  if (is_regex_letter(s[i])) {
    while (j < s.size() && is_regex_letter(s[j])) ++j;
  } else if (is_regex_number(s[i])) {
    ++j;
    if (!clip)
      while (j < s.size() && is_regex_number(s[j])) ++j;
  } else {
    while (j < s.size() && !is_regex_space(s[j]) && !is_regex_letter(s[j]) &&
           !is_regex_number(s[j]))
      ++j;
  }
  return j;
}

}  // namespace

ClipTokenizer ClipTokenizer::from_folder(const std::string& dir) {
  ClipTokenizer t;
  const std::string config_file = dir + "/tokenizer_config.json";
  const nlohmann::json config = read_tokenizer_config(dir);
  const std::string json_file = dir + "/tokenizer.json";
  std::string vocab_file, merges_file;
  nlohmann::json tokenizer_json;
  // Each merge with the line (merges.txt) or index (tokenizer.json) messages name.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> merge_where;
  if (file_exists(json_file)) {
    vocab_file = merges_file = json_file;
    tokenizer_json = core::read_json_file(json_file);
    const nlohmann::json& model = tokenizer_json_model(tokenizer_json, json_file, "BPE");
    t.vocab_ = vocabulary_object(model["vocab"], json_file, "field 'model.vocab'");
    const nlohmann::json& list = model.contains("merges") ? model["merges"] : nlohmann::json();
    if (!list.is_array())
      throw ConfigError(json_file + ": field 'model.merges': expected an array, found " +
                        list.type_name());
    for (std::size_t i = 0; i < list.size(); ++i) {
      const nlohmann::json& m = list[i];
      const std::string where = json_file + ": field 'model.merges[" + std::to_string(i) + "]'";
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else if (m.is_string() && std::count(m.get_ref<const std::string&>().begin(),
                                             m.get_ref<const std::string&>().end(), ' ') == 1) {
        const std::string& s = m.get_ref<const std::string&>();
        merges.emplace_back(s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1));
      } else {
        throw ConfigError(where + ": expected \"a b\" or [\"a\", \"b\"], found " +
                          m.dump().substr(0, 200));
      }
      merge_where.push_back(where);
    }
  } else {
    vocab_file = dir + "/vocab.json";
    merges_file = dir + "/merges.txt";
    const nlohmann::json vocab = core::parse_json_text(read_text_file(vocab_file), vocab_file);
    if (!vocab.is_object())
      throw ConfigError(vocab_file + ": expected a JSON object of token -> id, found " +
                        vocab.type_name());
    t.vocab_ = vocabulary_object(vocab, vocab_file, "vocabulary");
    // tokenizers' BPE::read_file: "#version" lines skipped, every other line "a b".
    const std::string text = read_text_file(merges_file);
    std::size_t start = 0, line = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string s = text.substr(start, end - start);
      if (!s.empty() && s.back() == '\r') s.pop_back();
      start = end + 1;
      ++line;
      if (s.rfind("#version", 0) == 0) continue;
      const std::string where = merges_file + ":" + std::to_string(line);
      if (std::count(s.begin(), s.end(), ' ') != 1)
        throw ConfigError(where + ": expected two symbols separated by one space, found '" +
                          s.substr(0, 200) + "'");
      merges.emplace_back(s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1));
      merge_where.push_back(where);
    }
  }

  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    for (const std::string* symbol : std::initializer_list<const std::string*>{&a, &b, nullptr}) {
      const std::string token = symbol ? *symbol : a + b;
      if (!t.vocab_.count(token))
        throw ConfigError(merge_where[rank] + ": merge '" + a + " " + b + "': '" + token +
                          "' is not in the vocabulary");
    }
    t.merges_[{t.vocab_.at(a), t.vocab_.at(b)}] = {static_cast<std::int64_t>(rank),
                                                   t.vocab_.at(a + b)};
  }

  t.model_max_length_ = config_model_max_length(config, config_file);
  t.pad_left_ = pad_left(config, config_file);
  const std::string unk = special_token(config, config_file, "unk_token", "<|endoftext|>");
  const std::string bos = special_token(config, config_file, "bos_token", "<|startoftext|>");
  const std::string eos = special_token(config, config_file, "eos_token", "<|endoftext|>");
  const std::string pad = special_token(config, config_file, "pad_token", "<|endoftext|>");
  t.unk_id_ = special_token_id(t.vocab_, unk, vocab_file, "unk_token");
  t.begin_id_ = special_token_id(t.vocab_, bos, vocab_file, "bos_token");
  t.end_id_ = special_token_id(t.vocab_, eos, vocab_file, "eos_token");
  t.pad_id_ = special_token_id(t.vocab_, pad, vocab_file, "pad_token");
  t.added_.add(bos, t.begin_id_);
  t.added_.add(eos, t.end_id_);
  t.added_.add(unk, t.unk_id_);
  t.added_.add(pad, t.pad_id_);
  if (tokenizer_json.is_object()) add_json_added_tokens(tokenizer_json, json_file, t.added_);
  std::int64_t max_id = t.added_.max_id();
  for (const auto& [token, id] : t.vocab_) max_id = std::max(max_id, id);
  t.vocab_size_ = max_id + 1;
  t.token_of_id_.resize(static_cast<std::size_t>(t.vocab_size_));
  for (const auto& [token, id] : t.vocab_) t.token_of_id_[static_cast<std::size_t>(id)] = token;
  byte_symbols(t.byte_symbol_);
  return t;
}

void ClipTokenizer::bpe(const std::string& bytes, std::vector<std::int64_t>& ids) const {
  struct Symbol {
    std::int64_t id;
    std::int64_t prev, next;  // -1: none
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string s = byte_symbol_[static_cast<unsigned char>(bytes[i])];
    if (i + 1 == bytes.size()) s += "</w>";
    const auto it = vocab_.find(s);
    const auto n = static_cast<std::int64_t>(i);
    symbols.push_back({it != vocab_.end() ? it->second : unk_id_, n - 1,
                       i + 1 < bytes.size() ? n + 1 : -1, false});
  }
  // (rank, position, merged id), smallest rank then leftmost first.
  using Merge = std::tuple<std::int64_t, std::int64_t, std::int64_t>;
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  auto push = [&](std::int64_t pos) {
    const Symbol& s = symbols[static_cast<std::size_t>(pos)];
    if (s.next < 0) return;
    const auto it = merges_.find({s.id, symbols[static_cast<std::size_t>(s.next)].id});
    if (it != merges_.end()) queue.emplace(it->second.first, pos, it->second.second);
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<std::int64_t>(i));
  while (!queue.empty()) {
    const auto [rank, pos, merged] = queue.top();
    queue.pop();
    Symbol& s = symbols[static_cast<std::size_t>(pos)];
    if (s.removed || s.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(s.next)];
    const auto it = merges_.find({s.id, right.id});
    if (it == merges_.end() || it->second.second != merged) continue;  // stale
    s.id = merged;
    right.removed = true;
    s.next = right.next;
    if (s.next >= 0) symbols[static_cast<std::size_t>(s.next)].prev = pos;
    if (s.prev >= 0) push(s.prev);
    push(pos);
  }
  for (const Symbol& s : symbols)
    if (!s.removed) ids.push_back(s.id);
}

void ClipTokenizer::run(std::u32string_view text, std::vector<std::int64_t>& ids) const {
  // Normalizers: NFC, every run of \s to one space, lower-case.
  const std::u32string composed = nfc(text);
  std::u32string spaced;
  spaced.reserve(composed.size());
  for (std::size_t i = 0; i < composed.size(); ++i) {
    if (!is_regex_space(composed[i])) {
      spaced += composed[i];
    } else if (i == 0 || !is_regex_space(composed[i - 1])) {
      spaced += U' ';
    }
  }
  const std::u32string normalized = lowercase(spaced);
  const std::u32string_view s(normalized);
  // Split (inverted, removed): the regex's matches are the pieces, whitespace between them goes.
  for (std::size_t i = 0; i < s.size();) {
    if (is_regex_space(s[i])) {
      ++i;
      continue;
    }
    const std::size_t end = match_end(s, i, true);
    const std::u32string_view piece = s.substr(i, end - i);
    for (std::size_t j = 0; j < piece.size();) {  // ByteLevel's GPT-2 split, then bytes
      const std::size_t sub_end = match_end(piece, j, false);
      bpe(encode_utf8(piece.substr(j, sub_end - j)), ids);
      j = sub_end;
    }
    i = end;
  }
}

void ClipTokenizer::append_ids(std::u32string_view text, std::vector<std::int64_t>& ids) const {
  run(text, ids);
}

std::vector<std::string> ClipTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  for (std::int64_t id : content_ids(text))
    tokens.push_back(id < static_cast<std::int64_t>(token_of_id_.size())
                         ? token_of_id_[static_cast<std::size_t>(id)]
                         : std::string());
  return tokens;
}

}  // namespace libreyolo::models::text
