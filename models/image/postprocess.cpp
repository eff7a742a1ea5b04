// Post-processing (see postprocess.h). Every step mirrors the transformers code in float32 so
// that scores, labels and their order match torch exactly (same at::topk).
#include "models/image/postprocess.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

#include "models/image/query_selection.h"

namespace libreyolo::image {

QuerySelection sigmoid_topk(const at::Tensor& logits, int64_t k) {
  const int64_t b = logits.size(0), q = logits.size(1), c = logits.size(2);
  QuerySelection s;
  at::Tensor index;
  std::tie(s.scores, index) = at::topk(at::sigmoid(logits).reshape({b, q * c}), k, -1);
  s.labels = at::remainder(index, c);
  s.query = at::div(index, c, "floor");
  return s;
}

at::Tensor center_to_corners(const at::Tensor& b) {
  auto u = b.unbind(-1);
  return at::stack({u[0] - 0.5 * u[2], u[1] - 0.5 * u[3], u[0] + 0.5 * u[2], u[1] + 0.5 * u[3]},
                   -1);
}

at::Tensor scale_factors(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                         const at::Device& device) {
  std::vector<float> v;
  for (const auto& [h, w] : sizes) {
    v.insert(v.end(), {static_cast<float>(w), static_cast<float>(h), static_cast<float>(w),
                       static_cast<float>(h)});
  }
  return at::tensor(v).view({static_cast<int64_t>(sizes.size()), 4}).to(device);
}

std::vector<Detections> post_process_object_detection(
    const at::Tensor& logits_in, const at::Tensor& pred_boxes_in,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, DetectionHead head,
    const PostProcessOptions& options) {
  if (!logits_in.defined() || !pred_boxes_in.defined() || logits_in.dim() != 3 ||
      pred_boxes_in.dim() != 3 || pred_boxes_in.size(2) != 4 ||
      logits_in.size(0) != pred_boxes_in.size(0) || logits_in.size(1) != pred_boxes_in.size(1)) {
    throw std::invalid_argument(c10::str(
        "post_process_object_detection: expected logits (B, Q, C) and pred_boxes (B, Q, 4), got ",
        logits_in.defined() ? c10::str(logits_in.sizes()) : "undefined", " and ",
        pred_boxes_in.defined() ? c10::str(pred_boxes_in.sizes()) : "undefined"));
  }
  const int64_t b = logits_in.size(0), q = logits_in.size(1), c = logits_in.size(2);
  if (!target_sizes.empty() && static_cast<int64_t>(target_sizes.size()) != b) {
    throw std::invalid_argument(c10::str("post_process_object_detection: ", target_sizes.size(),
                                         " target sizes for a batch of ", b));
  }
  if (q == 0 || c == 0) throw std::invalid_argument("post_process_object_detection: no queries");
  if (head == DetectionHead::prompted)
    throw std::invalid_argument(
        "post_process_object_detection: a text-prompted detector's post-processing needs its "
        "prompts (PromptedDetector::post_process)");
  const at::Tensor logits = logits_in.to(at::kFloat);
  at::Tensor boxes = center_to_corners(pred_boxes_in.to(at::kFloat));
  at::Tensor scale;
  if (!target_sizes.empty()) scale = scale_factors(target_sizes, logits.device()).unsqueeze(1);

  at::Tensor scores, labels, query;
  if (head == DetectionHead::detr) {
    if (c < 2)
      throw std::invalid_argument(c10::str("post_process_object_detection: DETR logits need the ",
                                           "\"no object\" class and at least one other, got ", c,
                                           " classes"));
    at::Tensor prob = at::softmax(logits, -1).narrow(-1, 0, c - 1);
    std::tie(scores, labels) = prob.max(-1);
    if (options.top_k > 0 && options.top_k < q) {
      std::tie(scores, query) = at::topk(scores, options.top_k, -1);
      labels = at::gather(labels, 1, query);
    } else {
      query = at::arange(q, at::TensorOptions().dtype(at::kLong).device(logits.device()))
                  .unsqueeze(0)
                  .expand({b, q});
    }
  } else if (head == DetectionHead::rt_detr && !options.use_focal_loss) {
    at::Tensor prob = at::softmax(logits, -1).narrow(-1, 0, c - 1);
    auto [best, best_label] = prob.max(-1);
    const int64_t k = options.top_k > 0 ? std::min(options.top_k, q) : q;
    std::tie(scores, query) = at::topk(best, k, -1);
    labels = at::gather(best_label, 1, query);
  } else {
    const int64_t family_k = head == DetectionHead::rt_detr ||
                                     head == DetectionHead::pp_doclayout ||
                                     head == DetectionHead::pp_doclayout_v2
                                 ? q
                                 : 100;
    const int64_t k = std::min(options.top_k > 0 ? options.top_k : family_k, q * c);
    auto selection = sigmoid_topk(logits, k);
    scores = std::move(selection.scores);
    labels = std::move(selection.labels);
    query = std::move(selection.query);
  }
  boxes = at::gather(boxes, 1, query.unsqueeze(-1).expand({b, query.size(1), 4}));
  if (scale.defined()) boxes = boxes * scale;

  std::vector<Detections> out;
  out.reserve(b);
  for (int64_t i = 0; i < b; ++i) {
    const at::Tensor keep = scores[i].gt(options.threshold);
    out.push_back({scores[i].index({keep}), labels[i].index({keep}), boxes[i].index({keep})});
  }
  return out;
}

Classifications classify(const at::Tensor& logits, int64_t k) {
  if (!logits.defined() || logits.dim() != 2 || logits.size(1) == 0)
    throw std::invalid_argument(
        c10::str("classify: expected logits (B, C), got ",
                 logits.defined() ? c10::str(logits.sizes()) : "undefined"));
  Classifications out;
  out.probabilities = at::softmax(logits.to(at::kFloat), -1);
  const int64_t kk = std::min(k > 0 ? k : 5, logits.size(1));
  std::tie(out.scores, out.labels) = at::topk(out.probabilities, kk, -1);
  return out;
}

std::string label_name(const std::map<int64_t, std::string>& id2label, int64_t id) {
  auto it = id2label.find(id);
  return it != id2label.end() ? it->second : "LABEL_" + std::to_string(id);
}

}  // namespace libreyolo::image
