#include "models/grounding_dino/text_inputs.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace libreyolo::models::grounding_dino {

std::string merge_labels(const std::vector<std::string>& labels) {
  if (labels.empty()) throw std::invalid_argument("text: no label");
  for (const auto& l : labels)
    if (l.find('.') != std::string::npos)
      throw std::invalid_argument(
          c10::str("text: label '", l, "' contains '.' (send one prompt \"a. b.\" instead)"));
  std::string out;
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& l = labels[i];
    auto b = l.find_first_not_of(" \t\n\r\f\v"), e = l.find_last_not_of(" \t\n\r\f\v");
    std::string s = b == std::string::npos ? "" : l.substr(b, e - b + 1);
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    out += (i ? ". " : "") + s;
  }
  return out + ".";
}

TextTensors encode_prompts(const text::BertTokenizer& tokenizer,
                           const std::vector<std::string>& prompts) {
  if (prompts.empty()) throw std::invalid_argument("text: no prompt");
  const auto encodings = tokenizer.encode_batch(prompts, text::Padding::kLongest, 0);
  const auto B = static_cast<int64_t>(encodings.size());
  const auto L = static_cast<int64_t>(encodings.front().ids.size());
  TextTensors t;
  t.input_ids = at::empty({B, L}, at::kLong);
  t.attention_mask = at::empty({B, L}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& e = encodings[static_cast<size_t>(b)];
    std::copy(e.ids.begin(), e.ids.end(), t.input_ids[b].data_ptr<int64_t>());
    std::copy(e.attention_mask.begin(), e.attention_mask.end(),
              t.attention_mask[b].data_ptr<int64_t>());
  }
  t.token_type_ids = at::zeros({B, L}, at::kLong);
  return t;
}

std::pair<at::Tensor, at::Tensor> phrase_masks(const at::Tensor& input_ids) {
  const int64_t B = input_ids.size(0), L = input_ids.size(1);
  const auto options = input_ids.options().dtype(at::kLong);
  const auto special = at::isin(
      input_ids, at::tensor(at::ArrayRef<int64_t>(kSpecialTokens), options.device(at::kCPU))
                     .to(input_ids.device()));
  const auto indices = at::arange(L, options).unsqueeze(0).expand({B, L});
  const auto prev = std::get<0>(at::cummax(at::where(special, indices, -1), 1));
  const auto next =
      at::flip(std::get<0>(at::cummin(at::flip(at::where(special, indices, L), {1}), 1)), {1});
  const auto valid = (next != 0) & (next != L - 1) & (next != L);
  auto mask = (next.unsqueeze(2) == next.unsqueeze(1)) & valid.unsqueeze(1);
  mask = at::eye(L, options.dtype(at::kBool)).unsqueeze(0).expand({B, L, L}) | mask;
  auto position_ids = at::where(valid, indices - prev - 1, at::zeros_like(indices));
  return {mask, at::clamp_min(position_ids, 0)};
}

}  // namespace libreyolo::models::grounding_dino
