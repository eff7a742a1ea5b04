// Instance segmentation post-processing (see instance_segmentation.h): the steps of
// transformers' RfDetrImageProcessor.post_process_instance_segmentation, in float32.
#include "models/image/instance_segmentation.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "models/image/query_selection.h"

namespace libreyolo::image {

std::vector<InstanceMasks> post_process_instance_segmentation(
    const at::Tensor& logits_in, const at::Tensor& pred_boxes, const at::Tensor& pred_masks,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    const InstanceSegmentationOptions& options) {
  const auto shape = [](const at::Tensor& t) {
    return t.defined() ? c10::str(t.sizes()) : std::string("undefined");
  };
  if (!logits_in.defined() || !pred_boxes.defined() || !pred_masks.defined() ||
      logits_in.dim() != 3 || pred_boxes.dim() != 3 || pred_boxes.size(2) != 4 ||
      pred_masks.dim() != 4 || pred_boxes.size(0) != logits_in.size(0) ||
      pred_masks.size(0) != logits_in.size(0) || pred_boxes.size(1) != logits_in.size(1) ||
      pred_masks.size(1) != logits_in.size(1)) {
    throw std::invalid_argument(c10::str(
        "post_process_instance_segmentation: expected logits (B, Q, C), pred_boxes (B, Q, 4) and "
        "pred_masks (B, Q, h, w), got ",
        shape(logits_in), ", ", shape(pred_boxes), " and ", shape(pred_masks)));
  }
  const int64_t b = logits_in.size(0), q = logits_in.size(1), c = logits_in.size(2);
  const int64_t mh = pred_masks.size(2), mw = pred_masks.size(3);
  if (!target_sizes.empty() && static_cast<int64_t>(target_sizes.size()) != b)
    throw std::invalid_argument(c10::str("post_process_instance_segmentation: ",
                                         target_sizes.size(), " target sizes for a batch of ", b));
  if (q == 0 || c == 0 || mh == 0 || mw == 0)
    throw std::invalid_argument("post_process_instance_segmentation: no queries or empty masks");

  const int64_t k = std::min(options.top_k > 0 ? options.top_k : q, q * c);
  const auto s = sigmoid_topk(logits_in.to(at::kFloat), k);
  at::Tensor boxes = center_to_corners(pred_boxes.to(at::kFloat));
  boxes = at::gather(boxes, 1, s.query.unsqueeze(-1).expand({b, k, 4}));
  if (!target_sizes.empty())
    boxes = boxes * scale_factors(target_sizes, boxes.device()).unsqueeze(1);
  const at::Tensor masks =
      at::gather(pred_masks, 1, s.query.unsqueeze(-1).unsqueeze(-1).expand({b, k, mh, mw}));

  const at::Tensor keep_all = s.scores.gt(options.threshold);
  const auto size_of = [&](int64_t i) {
    return target_sizes.empty() ? std::pair<int64_t, int64_t>{mh, mw} : target_sizes[i];
  };
  if (options.max_mask_pixels > 0) {
    // Doubles: a hostile target size must not overflow the check itself.
    const at::Tensor kept = keep_all.sum(1).to(at::kCPU);
    double pixels = 0;
    int64_t instances = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = kept[i].item<int64_t>();
      instances += n;
      pixels += static_cast<double>(n) * static_cast<double>(size_of(i).first) *
                static_cast<double>(size_of(i).second);
    }
    if (pixels > static_cast<double>(options.max_mask_pixels)) {
      // Exact below 2^63; beyond, the double itself (a cast would be UB: oip_request_fuzz).
      const std::string shown =
          pixels < 9.2e18 ? std::to_string(static_cast<int64_t>(pixels)) : c10::str(pixels);
      throw std::length_error(
          c10::str("post_process_instance_segmentation: ", instances, " instances make ", shown,
                   " mask pixels, above the limit of ", options.max_mask_pixels));
    }
  }
  // Float32 temporaries of the resize: at most this many pixels at once.
  constexpr int64_t kResizeChunkPixels = int64_t{1} << 24;

  std::vector<InstanceMasks> out;
  out.reserve(b);
  for (int64_t i = 0; i < b; ++i) {
    const auto [h, w] = size_of(i);
    const at::Tensor keep = keep_all[i];
    InstanceMasks r;
    r.detections = {s.scores[i].index({keep}), s.labels[i].index({keep}), boxes[i].index({keep})};
    const at::Tensor logits = masks[i].index({keep});
    if (logits.size(0) == 0) {
      r.masks = at::zeros({0, h, w}, logits.options().dtype(at::kBool));
      out.push_back(std::move(r));
      continue;
    }
    const int64_t k = logits.size(0);
    const int64_t chunk = std::max<int64_t>(1, kResizeChunkPixels / std::max<int64_t>(1, h * w));
    std::vector<at::Tensor> parts;
    for (int64_t j = 0; j < k; j += chunk)
      parts.push_back(at::upsample_bilinear2d(
                          logits.narrow(0, j, std::min(chunk, k - j)).unsqueeze(1).to(at::kFloat),
                          {h, w}, /*align_corners=*/false)
                          .squeeze(1)
                          .gt(options.mask_threshold));
    const at::Tensor binary = parts.size() == 1 ? parts[0] : at::cat(parts);
    const at::Tensor nonempty = binary.flatten(1).any(1);
    r.masks = binary.index({nonempty});
    r.detections.scores = r.detections.scores.index({nonempty});
    r.detections.labels = r.detections.labels.index({nonempty});
    r.detections.boxes = r.detections.boxes.index({nonempty});
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<int64_t> coco_rle_counts(const at::Tensor& mask) {
  if (!mask.defined() || mask.dim() != 2)
    throw std::invalid_argument(
        c10::str("coco_rle_counts: expected a (H, W) mask, got ",
                 mask.defined() ? c10::str(mask.sizes()) : std::string("undefined")));
  // Column-major: the transpose's rows are the mask's columns.
  const at::Tensor pixels = mask.ne(0).t().contiguous().to(at::kCPU).to(at::kByte);
  const auto* p = pixels.data_ptr<uint8_t>();
  const auto* const end = p + pixels.numel();
  // Each run ends where the other value first appears: memchr (vectorised) instead of a loop
  // per pixel, which made a within-budget 8388615x5 RLE request take 20 s under the fuzzer
  // (oip_request_fuzz; docs/FUZZING.md Findings).
  std::vector<int64_t> counts;
  uint8_t value = 0;  // COCO's first run counts zeros; ne(0) left only 0 and 1
  const auto* at = p;
  while (true) {
    const auto left = static_cast<std::size_t>(end - at);  // memchr wants a valid pointer
    const auto* next =
        left ? static_cast<const uint8_t*>(std::memchr(at, value ^ 1, left)) : nullptr;
    if (!next) next = end;
    counts.push_back(next - at);
    if (next == end) break;
    at = next;
    value ^= 1;
  }
  return counts;
}

}  // namespace libreyolo::image
