#include "models/omdet_turbo/postprocess.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace libreyolo::models::omdet_turbo {

at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& labels,
                       double iou_threshold) {
  const int64_t k = boxes.size(0);
  if (k == 0) return at::empty({0}, at::kLong);
  const auto b = boxes.to(at::kCPU, at::kFloat).contiguous();
  // _batched_nms_coordinate_trick: offsets = idxs.to(boxes) * (boxes.max() + 1).
  const auto offsets = labels.to(at::kCPU).to(at::kFloat) * (b.max() + 1);
  const auto shifted = (b + offsets.unsqueeze(1)).contiguous();
  const auto s = scores.to(at::kCPU, at::kFloat).contiguous();
  // torchvision's CPU nms_kernel: order by score (descending), greedy suppression.
  const auto order = std::get<1>(s.sort(/*stable=*/false, /*dim=*/0, /*descending=*/true));
  const auto* o = order.data_ptr<int64_t>();
  const auto* x = shifted.data_ptr<float>();
  std::vector<float> area(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    area[i] = (x[4 * i + 2] - x[4 * i]) * (x[4 * i + 3] - x[4 * i + 1]);
  std::vector<char> suppressed(static_cast<size_t>(k), 0);
  std::vector<int64_t> keep;
  for (int64_t a = 0; a < k; ++a) {
    const int64_t i = o[a];
    if (suppressed[i]) continue;
    keep.push_back(i);
    for (int64_t c = a + 1; c < k; ++c) {
      const int64_t j = o[c];
      if (suppressed[j]) continue;
      const float w =
          std::max(0.f, std::min(x[4 * i + 2], x[4 * j + 2]) - std::max(x[4 * i], x[4 * j]));
      const float h = std::max(
          0.f, std::min(x[4 * i + 3], x[4 * j + 3]) - std::max(x[4 * i + 1], x[4 * j + 1]));
      const float inter = w * h;
      if (inter / (area[i] + area[j] - inter) > iou_threshold) suppressed[j] = 1;
    }
  }
  return at::tensor(keep, at::kLong);
}

std::vector<image::Detections> post_process_grounded_object_detection(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const std::vector<int64_t>& num_classes,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, double threshold,
    double nms_threshold) {
  const int64_t batch = logits.size(0);
  if (logits.dim() != 3 || pred_boxes.dim() != 3 || pred_boxes.size(0) != batch ||
      pred_boxes.size(1) != logits.size(1) || static_cast<int64_t>(num_classes.size()) != batch ||
      static_cast<int64_t>(target_sizes.size()) != batch)
    throw std::invalid_argument(
        c10::str("omdet-turbo post-processing: logits ", logits.sizes(), ", pred_boxes ",
                 pred_boxes.sizes(), ", ", num_classes.size(), " class counts and ",
                 target_sizes.size(), " target sizes do not describe one batch"));
  const int64_t q = logits.size(1), c = logits.size(2);
  const auto scores_all = logits.to(at::kCPU, at::kFloat).sigmoid();
  const auto boxes_all = pred_boxes.to(at::kCPU, at::kFloat);
  // compute_score: the class of flat index k is k % C.
  const auto classes = at::arange(c, at::kLong).repeat({q});
  std::vector<image::Detections> out;
  for (int64_t b = 0; b < batch; ++b) {
    const auto [height, width] = target_sizes[b];
    auto [scores, index] = scores_all[b].flatten().topk(q);
    auto labels = classes.index_select(0, index);
    auto boxes = boxes_all[b].index_select(0, at::div(index, c, "floor"));
    // center_to_corners_format, then * [w, h, w, h] (an int64 tensor upstream).
    const auto cx = boxes.select(1, 0), cy = boxes.select(1, 1);
    const auto bw = boxes.select(1, 2), bh = boxes.select(1, 3);
    boxes = at::stack({cx - 0.5 * bw, cy - 0.5 * bh, cx + 0.5 * bw, cy + 0.5 * bh}, -1) *
            at::tensor({width, height, width, height}, at::kLong);
    const auto kept = scores.gt(threshold).logical_and(labels.lt(num_classes[b]));
    const auto idx = kept.nonzero().view(-1);
    scores = scores.index_select(0, idx);
    labels = labels.index_select(0, idx);
    boxes = boxes.index_select(0, idx);
    const auto keep = batched_nms(boxes, scores, labels, nms_threshold);
    image::Detections d;
    d.scores = scores.index_select(0, keep);
    d.labels = labels.index_select(0, keep);
    boxes = boxes.index_select(0, keep);
    const auto w = static_cast<double>(width), h = static_cast<double>(height);
    d.boxes = at::stack({boxes.select(1, 0).clamp(0, w), boxes.select(1, 1).clamp(0, h),
                         boxes.select(1, 2).clamp(0, w), boxes.select(1, 3).clamp(0, h)},
                        -1);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace libreyolo::models::omdet_turbo
