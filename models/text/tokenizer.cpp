#include "models/text/tokenizer.h"

#include <algorithm>
#include <stdexcept>

#include "models/text/unicode.h"

namespace libreyolo::models::text {

void AddedTokens::add(std::string content, std::int64_t id) {
  if (content.empty()) return;
  for (auto& [c, i] : tokens_) {
    if (c == content) {
      i = id;
      return;
    }
  }
  tokens_.emplace_back(std::move(content), id);
}

std::int64_t AddedTokens::max_id() const {
  std::int64_t m = -1;
  for (const auto& t : tokens_) m = std::max(m, t.second);
  return m;
}

std::vector<std::pair<std::string_view, std::int64_t>> AddedTokens::split(
    std::string_view text) const {
  std::vector<std::pair<std::string_view, std::int64_t>> pieces;
  std::size_t run = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::pair<std::string, std::int64_t>* best = nullptr;
    for (const auto& t : tokens_) {
      if (text.compare(i, t.first.size(), t.first) == 0 &&
          (!best || t.first.size() > best->first.size()))
        best = &t;
    }
    if (!best) {
      ++i;
      continue;
    }
    if (i > run) pieces.emplace_back(text.substr(run, i - run), -1);
    pieces.emplace_back(text.substr(i, best->first.size()), best->second);
    i += best->first.size();
    run = i;
  }
  if (run < text.size()) pieces.emplace_back(text.substr(run), -1);
  return pieces;
}

std::vector<std::int64_t> Tokenizer::content_ids(std::string_view text) const {
  decode_utf8(text);  // the whole text's validity first, so that the offset is the text's
  std::vector<std::int64_t> ids;
  for (const auto& [piece, id] : added_.split(text)) {
    if (id >= 0) {
      ids.push_back(id);
    } else {
      append_ids(decode_utf8(piece), ids);
    }
  }
  return ids;
}

Encoding Tokenizer::encode(std::string_view text, std::int64_t max_length) const {
  if (max_length == 0) max_length = model_max_length_;
  if (max_length != 0 && max_length < 2)
    throw std::invalid_argument("max_length " + std::to_string(max_length) +
                                ": the begin and end tokens need 2");
  std::vector<std::int64_t> content = content_ids(text);
  if (max_length != 0 && static_cast<std::int64_t>(content.size()) > max_length - 2)
    content.resize(static_cast<std::size_t>(max_length - 2));
  Encoding e;
  e.ids.reserve(content.size() + 2);
  e.ids.push_back(begin_id_);
  e.ids.insert(e.ids.end(), content.begin(), content.end());
  e.ids.push_back(end_id_);
  e.attention_mask.assign(e.ids.size(), 1);
  return e;
}

std::vector<Encoding> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                              Padding padding, std::int64_t max_length) const {
  if (max_length == 0) max_length = model_max_length_;
  if (padding == Padding::kMaxLength && max_length == 0)
    throw std::invalid_argument(
        "padding to max_length: no max_length (the tokenizer has no "
        "model_max_length)");
  std::vector<Encoding> out;
  out.reserve(texts.size());
  std::size_t longest = 0;
  for (const std::string& t : texts) {
    out.push_back(encode(t, max_length));
    longest = std::max(longest, out.back().ids.size());
  }
  if (padding == Padding::kNone) return out;
  const std::size_t target =
      padding == Padding::kMaxLength ? static_cast<std::size_t>(max_length) : longest;
  for (Encoding& e : out) {
    const std::size_t n = target - e.ids.size();
    const auto ids_at = pad_left_ ? e.ids.begin() : e.ids.end();
    e.ids.insert(ids_at, n, pad_id_);
    const auto mask_at = pad_left_ ? e.attention_mask.begin() : e.attention_mask.end();
    e.attention_mask.insert(mask_at, n, 0);
  }
  return out;
}

}  // namespace libreyolo::models::text
