#include "server/instance/prompt_cache.h"

#include <algorithm>
#include <stdexcept>

namespace libreyolo::server {

PromptCache::PromptCache(std::int64_t budget_bytes) : budget_(budget_bytes) {}

void PromptCache::insert(const std::string& label, at::Tensor row) {
  const std::int64_t size = row.numel() * static_cast<std::int64_t>(row.element_size()) +
                            static_cast<std::int64_t>(label.size());
  if (size > budget_) return;
  while (bytes_ + size > budget_ && !lru_.empty()) {
    const auto& [old, t] = lru_.back();
    bytes_ -= t.numel() * static_cast<std::int64_t>(t.element_size()) +
              static_cast<std::int64_t>(old.size());
    index_.erase(old);
    lru_.pop_back();
  }
  lru_.emplace_front(label, std::move(row));
  index_[label] = lru_.begin();
  bytes_ += size;
}

PromptCache::Embedded PromptCache::embed(const models::PromptedDetector& detector,
                                         const std::vector<std::vector<std::string>>& labels) {
  Embedded out;
  if (labels.empty() ||
      std::any_of(labels.begin(), labels.end(), [](const auto& image) { return image.empty(); }))
    throw std::invalid_argument("prompt cache: every image needs at least one label");
  std::unordered_map<std::string, at::Tensor> rows;  // the batch's distinct labels
  std::vector<std::string> missing;
  for (const auto& image : labels)
    for (const auto& label : image) {
      if (rows.count(label)) continue;
      const auto it = index_.find(label);
      if (it == index_.end()) {
        rows[label] = at::Tensor();
        missing.push_back(label);
        continue;
      }
      lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
      rows[label] = it->second->second;
      ++out.hits;
    }
  if (!missing.empty()) {
    // One text forward for every missing label; each row cloned so that it owns its memory
    // (a view would keep the whole batch's storage alive).
    const auto computed = detector.label_embeddings(missing);
    for (size_t i = 0; i < missing.size(); ++i) {
      auto row = computed[static_cast<int64_t>(i)].clone();
      rows[missing[i]] = row;
      insert(missing[i], row);
    }
    out.misses = static_cast<std::int64_t>(missing.size());
  }
  std::int64_t q = 0;
  for (const auto& image : labels) q = std::max<std::int64_t>(q, image.size());
  const auto& any = rows.begin()->second;
  const auto b = static_cast<std::int64_t>(labels.size());
  out.embeddings = at::zeros({b, q, any.size(0)}, any.options());
  out.query_mask = at::zeros({b, q}, at::TensorOptions().dtype(at::kBool));
  for (std::int64_t i = 0; i < b; ++i) {
    const auto& image = labels[static_cast<size_t>(i)];
    std::vector<at::Tensor> mine;
    for (const auto& label : image) mine.push_back(rows.at(label));
    out.embeddings[i].slice(0, 0, static_cast<std::int64_t>(image.size())).copy_(at::stack(mine));
    out.query_mask[i].slice(0, 0, static_cast<std::int64_t>(image.size())).fill_(true);
  }
  out.query_mask = out.query_mask.to(any.device());
  return out;
}

}  // namespace libreyolo::server
