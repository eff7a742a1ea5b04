// Panoptic segmentation post-processing (see panoptic.h): the steps of transformers'
// DetrImageProcessor.post_process_panoptic_segmentation, in its order, in float32.
#include "models/image/panoptic.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace libreyolo::image {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("post_process_panoptic_segmentation: " + what);
}

/// Python's round(x, 6) for the scores upstream reports.
double round6(double x) { return std::nearbyint(x * 1e6) / 1e6; }

/// compute_segments for one image's kept queries: probs (K, h, w) sigmoid mask probabilities,
/// scores / labels (K).
PanopticResult compute_segments(at::Tensor probs, const at::Tensor& scores,
                                const std::vector<int64_t>& labels,
                                const std::pair<int64_t, int64_t>& size, const PanopticOptions& o) {
  if (probs.size(1) != size.first || probs.size(2) != size.second)
    probs = at::upsample_bilinear2d(probs.unsqueeze(0), {size.first, size.second},
                                    /*align_corners=*/false)[0];
  probs = probs * scores.view({-1, 1, 1});  // weigh each mask by its query's score
  const auto winner = probs.argmax(0);      // (H, W): the first of equal maxima, as torch
  PanopticResult r;
  r.segmentation = at::zeros({size.first, size.second}, probs.options().dtype(at::kInt));
  const auto score_values = scores.to(at::kDouble).cpu();
  std::map<int64_t, int64_t> fused_ids;  // label -> its segment id (stuff_memory_list)
  int64_t current = 0;
  for (int64_t k = 0; k < static_cast<int64_t>(labels.size()); ++k) {
    const int64_t label = labels[k];
    const bool fuse = o.label_ids_to_fuse.count(label) > 0;
    // check_segment_validity: the pixels query k wins against its own mask's.
    const auto mask_k = winner.eq(k);
    const int64_t area = mask_k.sum().item<int64_t>();
    const int64_t original = probs[k].ge(o.mask_threshold).sum().item<int64_t>();
    if (area <= 0 || original <= 0) continue;
    // area_ratio = mask_k_area / original_area: a float32 division of two int64 tensors.
    const float ratio = static_cast<float>(area) / static_cast<float>(original);
    if (!(ratio > o.overlap_mask_area_threshold)) continue;
    const auto found = fused_ids.find(label);
    current = found != fused_ids.end() ? found->second : current + 1;
    r.segmentation.masked_fill_(mask_k, current);
    r.segments.push_back({current, label, fuse, round6(score_values[k].item<double>())});
    if (fuse) fused_ids[label] = current;
  }
  return r;
}

}  // namespace

std::vector<PanopticResult> post_process_panoptic_segmentation(
    const at::Tensor& logits, const at::Tensor& pred_masks,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, const PanopticOptions& o) {
  if (logits.dim() != 3 || pred_masks.dim() != 4 || logits.size(0) != pred_masks.size(0) ||
      logits.size(1) != pred_masks.size(1))
    fail(c10::str("expected logits (B, Q, C + 1) and pred_masks (B, Q, h, w), got ", logits.sizes(),
                  " and ", pred_masks.sizes()));
  const int64_t B = logits.size(0), num_labels = logits.size(2) - 1;
  if (num_labels < 1)
    fail(c10::str("logits need the \"no object\" class and at least one other, got ",
                  logits.size(2), " classes"));
  if (!target_sizes.empty() && static_cast<int64_t>(target_sizes.size()) != B)
    fail(c10::str(target_sizes.size(), " target sizes for ", B, " images"));
  for (const auto& [h, w] : target_sizes)
    if (h <= 0 || w <= 0) fail(c10::str("target size ", h, "x", w, " is not positive"));
  const auto probs = pred_masks.to(at::kFloat).sigmoid();
  const auto [scores, labels] = at::softmax(logits.to(at::kFloat), -1).max(-1);
  std::vector<PanopticResult> results;
  for (int64_t i = 0; i < B; ++i) {
    const std::pair<int64_t, int64_t> size =
        target_sizes.empty() ? std::make_pair(probs.size(2), probs.size(3)) : target_sizes[i];
    // remove_low_and_no_objects: not "no object" and score > threshold, query order kept.
    const auto keep = labels[i].ne(num_labels).logical_and(scores[i].gt(o.threshold));
    const auto index = keep.nonzero().view(-1);
    if (index.numel() == 0) {
      results.push_back(
          {at::full({size.first, size.second}, -1, probs.options().dtype(at::kInt)), {}});
      continue;
    }
    const auto kept_labels = labels[i].index_select(0, index).cpu();
    std::vector<int64_t> label_list(kept_labels.data_ptr<int64_t>(),
                                    kept_labels.data_ptr<int64_t>() + kept_labels.numel());
    results.push_back(compute_segments(probs[i].index_select(0, index),
                                       scores[i].index_select(0, index), label_list, size, o));
  }
  return results;
}

}  // namespace libreyolo::image
