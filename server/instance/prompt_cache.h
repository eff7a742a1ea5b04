// The label-embedding cache of one model instance (serving.yaml `prompt_cache_mb`): for the
// open-vocabulary families that embed each label alone (models::PromptedDetector::embeds_labels:
// OWL-ViT, OWLv2), a label's text-tower output is kept by its text, least recently used evicted
// past the byte budget, so a repeated class list costs the vision forward only. Hits and misses
// go to /metrics (libreyolo_prompt_cache_{hits,misses}_total). One per instance: its tensors
// live on the instance's device; used by the instance's worker only (not thread-safe).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/prompted.h"

namespace libreyolo::server {

class PromptCache {
 public:
  /// `budget_bytes` > 0.
  explicit PromptCache(std::int64_t budget_bytes);

  /// A batch's labels embedded: `embeddings` (B, Qmax, D) in the model's dtype and device, the
  /// rows of each image's labels then zeros, `query_mask` (B, Qmax) bool (false on padding);
  /// `hits` / `misses` count the batch's distinct labels found / computed.
  struct Embedded {
    at::Tensor embeddings, query_mask;
    std::int64_t hits = 0, misses = 0;
  };

  /// Looks every distinct label of `labels` (one list per image, each non-empty) up, embeds the
  /// missing ones in one detector.label_embeddings call and keeps them (a label whose row alone
  /// exceeds the budget is not kept). Throws what label_embeddings throws.
  Embedded embed(const models::PromptedDetector& detector,
                 const std::vector<std::vector<std::string>>& labels);

  std::int64_t bytes() const { return bytes_; }  ///< held now
  std::size_t size() const { return index_.size(); }

 private:
  using Entry = std::pair<std::string, at::Tensor>;
  void insert(const std::string& label, at::Tensor row);

  std::int64_t budget_, bytes_ = 0;
  std::list<Entry> lru_;  ///< most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace libreyolo::server
