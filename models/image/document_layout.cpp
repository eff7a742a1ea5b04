// PPDocLayoutV3ImageProcessor's post-processing (image_processing_pp_doclayout_v3.py, 5.17).

#include "models/image/document_layout.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace libreyolo::image {

at::Tensor reading_order(const at::Tensor& order_logits) {
  if (!order_logits.defined() || order_logits.dim() != 3 ||
      order_logits.size(1) != order_logits.size(2))
    throw std::invalid_argument(
        c10::str("reading_order: expected order_logits (B, Q, Q), got ",
                 order_logits.defined() ? c10::str(order_logits.sizes()) : "undefined"));
  const at::Tensor scores = at::sigmoid(order_logits.to(at::kFloat));
  const at::Tensor votes = scores.triu(1).sum(1) + (1.0 - scores.transpose(1, 2)).tril(-1).sum(1);
  const at::Tensor pointers = at::argsort(votes, /*dim=*/1, /*descending=*/false);
  const int64_t b = votes.size(0), q = votes.size(1);
  const at::Tensor ranks = at::arange(q, pointers.options()).expand({b, q});
  return at::empty_like(pointers).scatter_(1, pointers, ranks);
}

std::vector<DocumentLayout> post_process_document_layout(
    const at::Tensor& logits_in, const at::Tensor& pred_boxes, const at::Tensor& order_logits,
    const at::Tensor& pred_masks, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    double threshold) {
  if (!logits_in.defined() || !pred_boxes.defined() || logits_in.dim() != 3 ||
      pred_boxes.dim() != 3 || pred_boxes.size(2) != 4 || logits_in.size(0) != pred_boxes.size(0) ||
      logits_in.size(1) != pred_boxes.size(1) || logits_in.size(1) == 0 || logits_in.size(2) == 0)
    throw std::invalid_argument(c10::str(
        "post_process_document_layout: expected logits (B, Q, C) and pred_boxes (B, Q, 4), got ",
        logits_in.defined() ? c10::str(logits_in.sizes()) : "undefined", " and ",
        pred_boxes.defined() ? c10::str(pred_boxes.sizes()) : "undefined"));
  const int64_t b = logits_in.size(0), q = logits_in.size(1), c = logits_in.size(2);
  if (!order_logits.defined() || order_logits.dim() != 3 || order_logits.size(0) != b ||
      order_logits.size(1) != q || order_logits.size(2) != q)
    throw std::invalid_argument(
        c10::str("post_process_document_layout: expected order_logits (", b, ", ", q, ", ", q,
                 "), got ", order_logits.defined() ? c10::str(order_logits.sizes()) : "undefined"));
  if (pred_masks.defined() &&
      (pred_masks.dim() != 4 || pred_masks.size(0) != b || pred_masks.size(1) != q))
    throw std::invalid_argument(c10::str("post_process_document_layout: expected pred_masks (", b,
                                         ", ", q, ", h, w), got ", pred_masks.sizes()));
  if (!target_sizes.empty() && static_cast<int64_t>(target_sizes.size()) != b)
    throw std::invalid_argument(c10::str("post_process_document_layout: ", target_sizes.size(),
                                         " target sizes for a batch of ", b));
  const at::Tensor order = reading_order(order_logits);
  const at::Tensor box = pred_boxes.to(at::kFloat);
  const at::Tensor center = box.narrow(-1, 0, 2), size = box.narrow(-1, 2, 2);
  at::Tensor boxes = at::cat({center - 0.5 * size, center + 0.5 * size}, -1);
  if (!target_sizes.empty()) {
    std::vector<float> s;
    for (const auto& [h, w] : target_sizes)
      s.insert(s.end(), {static_cast<float>(w), static_cast<float>(h), static_cast<float>(w),
                         static_cast<float>(h)});
    boxes = boxes * at::tensor(s).view({b, 1, 4}).to(boxes.device());
  }
  const auto [scores, index] = at::topk(at::sigmoid(logits_in.to(at::kFloat)).flatten(1), q, -1);
  const at::Tensor labels = index.remainder(c), query = index.div(c, "floor");
  boxes = boxes.gather(1, query.unsqueeze(-1).expand({b, q, 4}));
  const at::Tensor ranks = order.gather(1, query);
  at::Tensor masks;
  if (pred_masks.defined()) {
    const int64_t h = pred_masks.size(2), w = pred_masks.size(3);
    masks = pred_masks.to(at::kFloat)
                .gather(1, query.view({b, q, 1, 1}).expand({b, q, h, w}))
                .sigmoid()
                .gt(threshold);
  }
  std::vector<DocumentLayout> out;
  out.reserve(b);
  for (int64_t i = 0; i < b; ++i) {
    const at::Tensor keep = scores[i].ge(threshold);
    const auto [sorted, by_rank] = at::sort(ranks[i].index({keep}));
    DocumentLayout page;
    page.order = sorted;
    page.detections.scores = scores[i].index({keep}).index({by_rank});
    page.detections.labels = labels[i].index({keep}).index({by_rank});
    page.detections.boxes = boxes[i].index({keep}).index({by_rank});
    if (masks.defined()) page.masks = masks[i].index({keep}).index({by_rank});
    out.push_back(std::move(page));
  }
  return out;
}

}  // namespace libreyolo::image
