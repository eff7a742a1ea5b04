// Open-vocabulary (text-prompted) detectors: a Model whose forward also takes text. The families
// that implement PromptedDetector (models/owlvit/: OWL-ViT, OWLv2; models/grounding_dino/)
// tokenize the labels of each image as their transformers processor does and return one logit
// per box and label (Grounding DINO: per box and caption token); their users
// (the server's prompted-detection task, the tests) find the interface with dynamic_cast from the
// Model that load_model returns (prompted_detector()).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace libreyolo::models {

/// The text side of one batch, as the family's processor makes it: what encode_labels returns
/// and forward_prompted reads, opaque to the callers (the server never looks inside). The
/// shapes are the family's: OWL-ViT / OWLv2 as below; a family with one caption per image
/// (Grounding DINO: the labels joined as "a cat. a dog.") uses input_ids / attention_mask /
/// token_type_ids (B, L).
struct TextQueries {
  /// OWL: (B, Qmax, L) int64 token ids, one row per label of each image, padded to max_length (L,
  /// the tokenizer's model_max_length or else the text tower's max_position_embeddings). An
  /// image with fewer than Qmax labels has rows of zeros after its own: the model masks them
  /// (their logits are float32's lowest), as transformers does for queries whose first id is 0.
  at::Tensor input_ids;
  at::Tensor attention_mask;  ///< input_ids' shape, int64, 1 on tokens, 0 on padding
  at::Tensor token_type_ids;  ///< BERT families: input_ids' shape, zeros; undefined for CLIP
  /// Per image, per label: the label had more than L - 2 tokens and was cut to them (its end
  /// token kept). transformers' OwlViTProcessor pads to max_length without truncating, so it
  /// fails on such a label where this truncates and says so.
  std::vector<std::vector<bool>> truncated;
};

/// What a prompted forward returns: `logits` (B, Q, Qmax) float32, one per box and label
/// (padding labels at float32's lowest), `pred_boxes` (B, Q, 4) (cx, cy, w, h) in [0, 1] of the
/// model's input (for OWLv2: of the padded square), float32; `objectness_logits` (B, Q) float32
/// for the families that predict it (OWLv2), undefined otherwise.
struct PromptedOutput : ModelOutput {
  at::Tensor objectness_logits;
};

/// The encoding of one cacheable piece of a prompt (PromptedDetector::encode_text: one label for
/// OWL-ViT / OWLv2, one image's caption for Grounding DINO): the family's tensors, opaque to the
/// callers, which keep it by its key and hand it back to forward_encoded.
struct EncodedText {
  std::vector<at::Tensor> tensors;
  /// What the tensors hold (numel x element size, summed): the cache's budget unit.
  std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const auto& t : tensors)
      n += t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
    return n;
  }
};

/// The thresholds of a prompted post-processing. OWL-ViT / OWLv2 read box_threshold only
/// (post_process_object_detection's `threshold`: a box is kept where its best label's sigmoid
/// score is > it); Grounding DINO's post_process_grounded_object_detection reads both.
struct PromptThresholds {
  double box_threshold = 0.1;
  double text_threshold = 0.25;
  /// OmDet-Turbo's post_process_grounded_object_detection `nms_threshold`: the IoU in [0, 1]
  /// above which a lower-scored box of the same label is dropped (torchvision batched_nms).
  /// Unread by the families without uses_nms_threshold().
  double nms_threshold = 0.5;
};

/// The detections of one image: image::Detections (scores (K) float32, labels (K) int64 = the
/// index of the label in that image's list, or -1 where the family names boxes with free
/// phrases (Grounding DINO: the prompt's tokens above text_threshold), boxes (K, 4) x0 y0 x1 y1
/// in original-image pixels), and `phrases`, the text of each box's label (K strings).
struct PromptedDetections : image::Detections {
  std::vector<std::string> phrases;
};

/// The prompted half of an open-vocabulary detector (implemented next to Model by the family).
class PromptedDetector {
 public:
  virtual ~PromptedDetector() = default;

  /// The most labels one image may carry (a request with more is refused before tokenizing).
  virtual int64_t max_labels() const = 0;
  /// L, the token length of one label after padding (and the truncation limit).
  virtual int64_t max_text_length() const = 0;

  /// Tokenizes `labels[b]` (the labels of image b, at least one each) with the checkpoint's
  /// tokenizer. Tensors on the model's device. Throws std::invalid_argument for an image without
  /// labels, more than max_labels() labels, or a label that is not UTF-8 ("labels[b][i]: invalid
  /// UTF-8 at byte k").
  virtual TextQueries encode_labels(const std::vector<std::vector<std::string>>& labels) const = 0;

  /// pixel_values (B, 3, H, W) as the family's image processor makes them, `queries` from
  /// encode_labels for the same B images. Throws std::invalid_argument for mismatched shapes.
  virtual PromptedOutput forward_prompted(const at::Tensor& pixel_values,
                                          const TextQueries& queries) const = 0;
  /// forward_prompted with the batch's pixel_mask (B, H, W) (1 = real pixel; undefined: all
  /// real), for the families whose model reads it (Grounding DINO: images of different sizes
  /// padded into one batch). The default ignores the mask (OWL-ViT / OWLv2 take none).
  virtual PromptedOutput forward_prompted_masked(const at::Tensor& pixel_values,
                                                 const at::Tensor& pixel_mask,
                                                 const TextQueries& queries) const {
    (void)pixel_mask;
    return forward_prompted(pixel_values, queries);
  }

  /// Which of `labels` encode_labels would cut to the token limit (the same shape as labels),
  /// without building tensors. Throws as encode_labels does for a label that is not UTF-8.
  virtual std::vector<std::vector<bool>> truncation(
      const std::vector<std::vector<std::string>>& labels) const = 0;

  /// Whether the family's text side splits into pieces encoded independently of the image and
  /// of each other, so that a piece's encoding can be cached across requests (the server's
  /// PromptCache, server/instance/prompt_cache.h) and forward_encoded computes forward_prompted
  /// from the pieces. OWL-ViT / OWLv2: one piece per label (CLIP's text tower reads each label
  /// alone); Grounding DINO: one piece per image, its caption (BERT reads the whole caption,
  /// before the fusion layers mix it with the image); OmDet-Turbo: one piece per class (CLIP
  /// reads each class alone) and one per task sentence (upstream's get_cached_class_embeddings /
  /// get_cached_task_embeddings).
  virtual bool caches_text() const { return false; }
  /// Per image of `labels` (as for encode_labels), the cache keys of its pieces, in the order
  /// forward_encoded reads them: OWL: its labels; Grounding DINO: one key, the exact token ids
  /// of its caption (int64 bytes); OmDet-Turbo: its classes, then its default task's key (see
  /// text_keys_with_tasks). Throws std::invalid_argument as encode_labels does;
  /// std::logic_error unless caches_text().
  virtual std::vector<std::vector<std::string>> text_keys(
      const std::vector<std::vector<std::string>>& labels) const;
  /// text_keys with tasks[b] the task sentence of image b ("" = the family's default), for the
  /// families that read one (uses_task()): OmDet-Turbo's keys of image b are its classes, then
  /// one key for its task. The default checks `tasks` as encode_with_tasks does (every task "")
  /// and returns text_keys(labels). Throws std::invalid_argument as encode_with_tasks does;
  /// std::logic_error unless caches_text().
  virtual std::vector<std::vector<std::string>> text_keys_with_tasks(
      const std::vector<std::vector<std::string>>& labels,
      const std::vector<std::string>& tasks) const;
  /// The pieces named by `keys` (text_keys' strings, any number), one EncodedText each, in one
  /// text forward: OWL: {the label's query embedding (D) in the model's dtype}; Grounding DINO:
  /// {text features after BERT and text_projection (T, d_model) in the model's dtype, the
  /// phrase self-attention mask (T, T) bool, position_ids (T) int64, token mask (T) bool}, T the
  /// caption's tokens cut at max_text_len. Tensors on the model's device, owning their memory
  /// (no views of the batch); OmDet-Turbo: a class {its end-token state through
  /// text_projection (E)}, a task {its token states (T, D)}, T its tokens with the start and end
  /// tokens, both in the model's dtype. Throws std::invalid_argument for a key text_keys cannot
  /// have made or a caption the text encoder refuses; std::logic_error unless caches_text().
  virtual std::vector<EncodedText> encode_text(const std::vector<std::string>& keys) const;
  /// forward_prompted_masked with the text already encoded: pieces[b] the encode_text results
  /// of text_keys(labels)[b], in that order (images with different pieces are padded and
  /// batched: OWL pads the labels with masked queries, Grounding DINO the captions to the
  /// longest with its padding token's features, OmDet-Turbo the classes with zero classes and
  /// the tasks with masked zero tokens, as upstream). pixel_values and pixel_mask as there. Throws
  /// std::invalid_argument for a pieces count other than B or pieces of another shape;
  /// std::logic_error unless caches_text().
  virtual PromptedOutput forward_encoded(const at::Tensor& pixel_values,
                                         const at::Tensor& pixel_mask,
                                         const std::vector<std::vector<EncodedText>>& pieces) const;

  /// The family's defaults (its processor's post-processing arguments).
  virtual PromptThresholds default_thresholds() const = 0;
  /// Whether post_process reads PromptThresholds::text_threshold (Grounding DINO) or not
  /// (OWL-ViT, OWLv2: a request that sets it is refused).
  virtual bool uses_text_threshold() const = 0;
  /// Whether post_process reads PromptThresholds::nms_threshold (OmDet-Turbo) or not (the
  /// others: a request that sets it is refused).
  virtual bool uses_nms_threshold() const { return false; }
  /// Whether the family reads a task sentence per image besides its labels (OmDet-Turbo's
  /// `task`, default "Detect <labels joined by ', '>."); the others: a request that sets one is
  /// refused.
  virtual bool uses_task() const { return false; }
  /// encode_labels with tasks[b] the task sentence of image b ("" = the family's default, the
  /// only value a family without uses_task() takes). Throws std::invalid_argument as
  /// encode_labels does, and for a tasks count other than the images', a task that is not
  /// UTF-8 ("tasks[b]: text: invalid UTF-8 at byte k") or a task where !uses_task().
  virtual TextQueries encode_with_tasks(const std::vector<std::vector<std::string>>& labels,
                                        const std::vector<std::string>& tasks) const;
  /// Whether encode_with_tasks cuts `task` to max_text_length() tokens (as the family's processor
  /// truncates it). Throws std::invalid_argument "task: text: invalid UTF-8 at byte k"; false
  /// unless uses_task().
  virtual bool task_truncated(const std::string& task) const {
    (void)task;
    return false;
  }

  /// The family's transformers post-processing of `out` for images of `target_sizes` (height,
  /// width) pixels (the originals, before the processor), `labels` as given to encode_labels.
  /// Works on out's device. Throws std::invalid_argument for mismatched batch sizes.
  virtual std::vector<PromptedDetections> post_process(
      const PromptedOutput& out, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
      const std::vector<std::vector<std::string>>& labels,
      const PromptThresholds& thresholds) const = 0;
};

namespace detail {

/// A family without a task sentence: `tasks` must hold one "" per image of `labels`. Throws
/// std::invalid_argument "tasks: 1 tasks for 2 images" / "tasks[b]: this family takes no task
/// sentence".
inline void check_no_tasks(const std::vector<std::vector<std::string>>& labels,
                           const std::vector<std::string>& tasks) {
  if (tasks.size() != labels.size())
    throw std::invalid_argument("tasks: " + std::to_string(tasks.size()) + " tasks for " +
                                std::to_string(labels.size()) + " images");
  for (size_t b = 0; b < tasks.size(); ++b)
    if (!tasks[b].empty())
      throw std::invalid_argument("tasks[" + std::to_string(b) +
                                  "]: this family takes no task sentence");
}

}  // namespace detail

inline TextQueries PromptedDetector::encode_with_tasks(
    const std::vector<std::vector<std::string>>& labels,
    const std::vector<std::string>& tasks) const {
  detail::check_no_tasks(labels, tasks);
  return encode_labels(labels);
}

inline std::vector<std::vector<std::string>> PromptedDetector::text_keys_with_tasks(
    const std::vector<std::vector<std::string>>& labels,
    const std::vector<std::string>& tasks) const {
  detail::check_no_tasks(labels, tasks);
  return text_keys(labels);
}

inline std::vector<std::vector<std::string>> PromptedDetector::text_keys(
    const std::vector<std::vector<std::string>>&) const {
  throw std::logic_error("text_keys: this family does not cache its text encoding");
}

inline std::vector<EncodedText> PromptedDetector::encode_text(
    const std::vector<std::string>&) const {
  throw std::logic_error("encode_text: this family does not cache its text encoding");
}

inline PromptedOutput PromptedDetector::forward_encoded(
    const at::Tensor&, const at::Tensor&, const std::vector<std::vector<EncodedText>>&) const {
  throw std::logic_error("forward_encoded: this family does not cache its text encoding");
}

/// A prompt in Grounding DINO's form as labels, for the command-line tools (libreyolo-predict,
/// libreyolo-bench-models): "a cat. a dog." -> {"a cat", "a dog"} (split at '.', each label
/// trimmed of spaces and tabs, empty ones dropped). The server's parser also reads JSON lists
/// (server/tasks/prompted_detection_io.h prompt_labels).
inline std::vector<std::string> split_labels(const std::string& prompt) {
  std::vector<std::string> labels;
  for (size_t from = 0; from <= prompt.size();) {
    const size_t dot = std::min(prompt.find('.', from), prompt.size());
    const std::string item = prompt.substr(from, dot - from);
    const auto first = item.find_first_not_of(" \t");
    if (first != std::string::npos)
      labels.push_back(item.substr(first, item.find_last_not_of(" \t") - first + 1));
    from = dot + 1;
  }
  return labels;
}

/// `model` as a PromptedDetector, or nullptr for a closed-set model.
inline const PromptedDetector* prompted_detector(const Model& model) {
  return dynamic_cast<const PromptedDetector*>(&model);
}

}  // namespace libreyolo::models
