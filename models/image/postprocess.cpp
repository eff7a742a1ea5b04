// Post-processing (see postprocess.h). Every step mirrors the transformers code in float32 so
// that scores, labels and their order match torch exactly (same at::topk).
#include "models/image/postprocess.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "models/image/query_selection.h"

namespace libreyolo::image {

namespace {

/// sigmoid_topk's selection from the sigmoid probabilities themselves, prob (B, Q, C).
QuerySelection probability_topk(const at::Tensor& prob, int64_t k) {
  const int64_t b = prob.size(0), q = prob.size(1), c = prob.size(2);
  QuerySelection s;
  at::Tensor index;
  std::tie(s.scores, index) = at::topk(prob.reshape({b, q * c}), k, -1);
  s.labels = at::remainder(index, c);
  s.query = at::div(index, c, "floor");
  return s;
}

}  // namespace

QuerySelection sigmoid_topk(const at::Tensor& logits, int64_t k) {
  return probability_topk(at::sigmoid(logits), k);
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

std::optional<Detections> detections_above(const float* prob, int64_t q, int64_t c, int64_t k,
                                           float threshold, const float* boxes,
                                           const float* scale) {
  std::vector<int64_t> kept;
  int64_t ranked_first = 0;  // above the threshold or NaN
  for (int64_t i = 0; i < q * c; ++i) {
    const float s = prob[i];
    if (s > threshold) {
      kept.push_back(i);
    } else if (!std::isnan(s)) {
      continue;
    }
    if (++ranked_first > k) return std::nullopt;
  }
  std::sort(kept.begin(), kept.end(), [prob](int64_t a, int64_t b) { return prob[a] > prob[b]; });
  for (std::size_t i = 1; i < kept.size(); ++i)
    if (prob[kept[i - 1]] == prob[kept[i]]) return std::nullopt;
  const auto n = static_cast<int64_t>(kept.size());
  Detections d{at::empty({n}, at::kFloat), at::empty({n}, at::kLong),
               at::empty({n, 4}, at::kFloat)};
  float* scores = d.scores.data_ptr<float>();
  int64_t* labels = d.labels.data_ptr<int64_t>();
  float* corners = d.boxes.data_ptr<float>();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t index = kept[j];
    scores[j] = prob[index];
    labels[j] = index % c;
    // center_to_corners (cx - 0.5 w, ...), then * scale: two float32 roundings, as ATen's.
    const float* b = boxes + (index / c) * 4;
    float* out = corners + j * 4;
    out[0] = b[0] - 0.5f * b[2];
    out[1] = b[1] - 0.5f * b[3];
    out[2] = b[0] + 0.5f * b[2];
    out[3] = b[1] + 0.5f * b[3];
    if (scale)
      for (int e = 0; e < 4; ++e) out[e] = out[e] * scale[e];
  }
  return d;
}

namespace {

/// The candidates of the sigmoid heads' top-k: the request's top_k, else the family's (RT-DETR,
/// PP-DocLayout: num_queries; Deformable DETR: 100), at most Q * C.
int64_t sigmoid_head_k(DetectionHead head, const PostProcessOptions& options, int64_t q,
                       int64_t c) {
  const int64_t family_k = head == DetectionHead::rt_detr || head == DetectionHead::pp_doclayout ||
                                   head == DetectionHead::pp_doclayout_v2
                               ? q
                               : 100;
  return std::min(options.top_k > 0 ? options.top_k : family_k, q * c);
}

/// The transformers code in ATen ops (the whole batch's top-k), for every head and device.
/// logits (B, Q, C) float32, pred_boxes (B, Q, 4); validated by the caller. `prob`, where
/// defined, is sigmoid(logits) already computed (a sigmoid head): the same values as the whole
/// batch's sigmoid, whose vectorised and scalar elements ATen splits by the tensor's length.
std::vector<Detections> topk_detections(
    const at::Tensor& logits, const at::Tensor& pred_boxes,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes, DetectionHead head,
    const PostProcessOptions& options, const at::Tensor& prob = at::Tensor()) {
  const int64_t b = logits.size(0), q = logits.size(1), c = logits.size(2);
  at::Tensor boxes = center_to_corners(pred_boxes.to(at::kFloat));
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
    const int64_t k = sigmoid_head_k(head, options, q, c);
    auto selection = prob.defined() ? probability_topk(prob, k) : sigmoid_topk(logits, k);
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

}  // namespace

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
  const bool sigmoid_head =
      head != DetectionHead::detr && !(head == DetectionHead::rt_detr && !options.use_focal_loss);
  if (!sigmoid_head || !logits.device().is_cpu() || !pred_boxes_in.device().is_cpu())
    return topk_detections(logits, pred_boxes_in, target_sizes, head, options);
  // On the CPU (the daemon's answers), each image without the full top-k where that is exact.
  const int64_t k = sigmoid_head_k(head, options, q, c);
  const at::Tensor prob = at::sigmoid(logits).contiguous();
  const at::Tensor centers = pred_boxes_in.to(at::kFloat).contiguous();
  const at::Tensor scale =
      target_sizes.empty() ? at::Tensor() : scale_factors(target_sizes, at::kCPU);  // (B, 4)
  std::vector<Detections> out;
  out.reserve(b);
  for (int64_t i = 0; i < b; ++i) {
    auto d = detections_above(prob.data_ptr<float>() + i * q * c, q, c, k,
                              static_cast<float>(options.threshold),
                              centers.data_ptr<float>() + i * q * 4,
                              scale.defined() ? scale.data_ptr<float>() + i * 4 : nullptr);
    if (!d) {  // more candidates than k, or tied scores: this image's full top-k
      std::vector<std::pair<int64_t, int64_t>> size;
      if (!target_sizes.empty()) size.push_back(target_sizes[i]);
      d = std::move(topk_detections(logits.narrow(0, i, 1), centers.narrow(0, i, 1), size, head,
                                    options, prob.narrow(0, i, 1))
                        .front());
    }
    out.push_back(std::move(*d));
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
