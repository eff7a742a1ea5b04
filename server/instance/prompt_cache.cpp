#include "server/instance/prompt_cache.h"

#include <algorithm>
#include <stdexcept>

namespace libreyolo::server {
namespace {

std::int64_t entry_bytes(const std::string& key, const models::EncodedText& piece) {
  return piece.bytes() + static_cast<std::int64_t>(key.size());
}

}  // namespace

PromptCache::PromptCache(std::int64_t budget_bytes) : budget_(budget_bytes) {}

void PromptCache::insert(const std::string& key, models::EncodedText piece) {
  const std::int64_t size = entry_bytes(key, piece);
  if (size > budget_) return;
  while (bytes_ + size > budget_ && !lru_.empty()) {
    const auto& [old, p] = lru_.back();
    bytes_ -= entry_bytes(old, p);
    index_.erase(old);
    lru_.pop_back();
  }
  lru_.emplace_front(key, std::move(piece));
  index_[key] = lru_.begin();
  bytes_ += size;
}

PromptCache::Encoded PromptCache::encode(const models::PromptedDetector& detector,
                                         const std::vector<std::vector<std::string>>& labels,
                                         const std::vector<std::string>& tasks) {
  if (labels.empty() ||
      std::any_of(labels.begin(), labels.end(), [](const auto& image) { return image.empty(); }))
    throw std::invalid_argument("prompt cache: every image needs at least one label");
  const auto keys =
      tasks.empty() ? detector.text_keys(labels) : detector.text_keys_with_tasks(labels, tasks);
  Encoded out;
  std::unordered_map<std::string, models::EncodedText> pieces;  // the batch's distinct keys
  std::vector<std::string> missing;
  for (const auto& image : keys)
    for (const auto& key : image) {
      if (pieces.count(key)) continue;
      const auto it = index_.find(key);
      if (it == index_.end()) {
        pieces[key] = {};
        missing.push_back(key);
        continue;
      }
      lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
      pieces[key] = it->second->second;
      ++out.hits;
    }
  if (!missing.empty()) {  // one text forward for every missing piece
    auto computed = detector.encode_text(missing);
    for (size_t i = 0; i < missing.size(); ++i) {
      pieces[missing[i]] = computed[i];
      insert(missing[i], std::move(computed[i]));
    }
    out.misses = static_cast<std::int64_t>(missing.size());
  }
  for (const auto& image : keys) {
    std::vector<models::EncodedText> mine;
    for (const auto& key : image) mine.push_back(pieces.at(key));
    out.pieces.push_back(std::move(mine));
  }
  return out;
}

}  // namespace libreyolo::server
