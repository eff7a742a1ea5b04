#include "models/grounding_dino/postprocess.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace libreyolo::models::grounding_dino {

std::vector<GroundedDetections> post_process_grounded_object_detection(
    const at::Tensor& logits, const at::Tensor& pred_boxes, const at::Tensor& input_ids,
    double box_threshold, double text_threshold,
    const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
    const text::BertTokenizer& tokenizer) {
  if (logits.dim() != 3 || pred_boxes.dim() != 3 || pred_boxes.size(2) != 4 ||
      pred_boxes.size(0) != logits.size(0) || pred_boxes.size(1) != logits.size(1))
    throw std::invalid_argument(
        c10::str("grounding_dino: logits (B, Q, T) and pred_boxes (B, Q, 4) "
                 "expected, got ",
                 logits.sizes(), " and ", pred_boxes.sizes()));
  const int64_t B = logits.size(0), T = logits.size(2);
  if (input_ids.dim() != 2 || input_ids.size(0) != B)
    throw std::invalid_argument(
        c10::str("grounding_dino: input_ids must be (", B, ", L), got ", input_ids.sizes()));
  if (!target_sizes.empty() && static_cast<int64_t>(target_sizes.size()) != B)
    throw std::invalid_argument(
        c10::str("grounding_dino: ", target_sizes.size(), " target sizes for a batch of ", B));
  const auto probs = logits.to(at::kCPU, at::kFloat).sigmoid();
  const auto scores = std::get<0>(probs.max(-1));
  auto boxes = pred_boxes.to(at::kCPU, at::kFloat);
  // center_to_corners_format: (cx - 0.5 w, cy - 0.5 h, cx + 0.5 w, cy + 0.5 h).
  const auto cx = boxes.select(2, 0), cy = boxes.select(2, 1);
  const auto w = boxes.select(2, 2), h = boxes.select(2, 3);
  boxes = at::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, -1);
  const auto ids = input_ids.to(at::kCPU, at::kLong);
  std::vector<GroundedDetections> out;
  for (int64_t b = 0; b < B; ++b) {
    auto image_boxes = boxes[b];
    if (!target_sizes.empty()) {
      const auto [height, width] = target_sizes[static_cast<size_t>(b)];
      const auto scale = at::tensor({static_cast<float>(width), static_cast<float>(height),
                                     static_cast<float>(width), static_cast<float>(height)});
      image_boxes = image_boxes * scale.unsqueeze(0);
    }
    const auto keep = scores[b] > box_threshold;
    GroundedDetections d;
    d.scores = scores[b].index({keep});
    d.boxes = image_boxes.index({keep});
    auto posmap = probs[b].index({keep}) > text_threshold;  // (N, T)
    posmap.slice(1, 0, 1).fill_(false);
    posmap.slice(1, T - 1).fill_(false);
    const int64_t L = ids.size(1);
    const auto* row_ids = ids[b].data_ptr<int64_t>();
    for (int64_t n = 0; n < posmap.size(0); ++n) {
      std::vector<int64_t> tokens;
      const auto nz = posmap[n].nonzero().view({-1});
      for (int64_t k = 0; k < nz.numel(); ++k) {
        const int64_t i = nz[k].item<int64_t>();
        if (i < L) tokens.push_back(row_ids[i]);
      }
      d.phrases.push_back(tokenizer.decode(tokens));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace libreyolo::models::grounding_dino
