// The text-encoding cache of one model instance (serving.yaml `prompt_cache_mb`): for the
// open-vocabulary families whose text side splits into pieces encoded apart from the image
// (models::PromptedDetector::caches_text: OWL-ViT / OWLv2 per label, Grounding DINO per caption,
// OmDet-Turbo per class and per task sentence), a piece's encoding is kept by its key (the
// label's text; the caption's exact token ids; OmDet's class text, 0xFF + its task), least
// recently used evicted past the byte budget, so a repeated prompt costs the vision forward only.
// Hits and misses go to /metrics (libreyolo_prompt_cache_{hits,misses}_total). One per instance:
// its tensors live on the instance's device; used by the instance's worker only (not
// thread-safe).
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

  /// A batch's text encoded: `pieces[b]` the encodings of image b's pieces (text_keys' order),
  /// what PromptedDetector::forward_encoded takes; `hits` / `misses` count the batch's distinct
  /// keys found / encoded.
  struct Encoded {
    std::vector<std::vector<models::EncodedText>> pieces;
    std::int64_t hits = 0, misses = 0;
  };

  /// Keys every image of `labels` (one list per image, each non-empty) with
  /// detector.text_keys_with_tasks (`tasks` one per image, "" = the default; empty: no tasks,
  /// detector.text_keys), looks every distinct key up, encodes the missing ones in one
  /// detector.encode_text call and keeps them (a piece whose encoding alone exceeds the budget
  /// is not kept). Throws std::invalid_argument for an image without labels, and what
  /// text_keys / encode_text throw.
  Encoded encode(const models::PromptedDetector& detector,
                 const std::vector<std::vector<std::string>>& labels,
                 const std::vector<std::string>& tasks = {});

  std::int64_t bytes() const { return bytes_; }  ///< held now: tensors plus keys
  std::size_t size() const { return index_.size(); }

 private:
  using Entry = std::pair<std::string, models::EncodedText>;
  void insert(const std::string& key, models::EncodedText piece);

  std::int64_t budget_, bytes_ = 0;
  std::list<Entry> lru_;  ///< most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace libreyolo::server
