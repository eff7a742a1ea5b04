#include "server/tasks/classifier_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

namespace libreyolo::server {
const std::vector<std::string>& classifier_default_outputs() {
  static const std::vector<std::string> names = {"logits", "probabilities", "scores", "labels",
                                                 "label_names"};
  return names;
}

ClassifierRequest parse_classifier_request(const api::InferRequest& request,
                                           const RequestLimits& limits, int64_t default_top_k) {
  ClassifierRequest r;
  r.top_k = default_top_k;
  for (const auto& [key, value] : request.parameters) {
    if (key == "top_k") r.top_k = top_k_param(value, default_top_k);
  }
  const api::InputTensor* images = nullptr;
  const api::InputTensor* pixels = nullptr;
  for (const auto& t : request.inputs) {
    const api::InputTensor** slot = t.name == "images"         ? &images
                                    : t.name == "pixel_values" ? &pixels
                                                               : nullptr;
    if (!slot) {
      invalid_argument(
          "unexpected input '" + t.name +
          "' (a classifier takes images (BYTES [N]) or pixel_values (FP32 [N,3,H,W]))");
    }
    if (*slot) invalid_argument("input '" + t.name + "' is given twice");
    *slot = &t;
  }
  static_cast<ImageInputs&>(r) = parse_image_inputs(images, pixels, limits);
  const auto& known = classifier_default_outputs();
  for (const auto& o : request.requested_outputs) {
    if (std::find(known.begin(), known.end(), o) == known.end()) {
      invalid_argument("unknown output '" + o +
                       "' (available: logits, probabilities, scores, labels, label_names)");
    }
    r.outputs.insert(o);
  }
  if (r.outputs.empty()) r.outputs.insert(known.begin(), known.end());
  return r;
}

std::vector<api::OutputTensor> classifier_outputs(const at::Tensor& logits,
                                                  const image::Classifications& classes,
                                                  const std::map<int64_t, std::string>& id2label,
                                                  const std::set<std::string>& outputs) {
  std::vector<api::OutputTensor> out;
  auto add_float = [&](const char* name, const at::Tensor& t) {
    if (!outputs.count(name)) return;
    const auto c = t.to(at::kCPU, at::kFloat).contiguous();
    out.push_back({name, "FP32", c.sizes().vec(), {}});
    append_raw(out.back().data, c.data_ptr<float>(), static_cast<std::size_t>(c.numel()));
  };
  add_float("logits", logits);
  add_float("probabilities", classes.probabilities);
  add_float("scores", classes.scores);
  const auto labels = classes.labels.to(at::kCPU, at::kLong).contiguous();
  if (outputs.count("labels")) {
    out.push_back({"labels", "INT64", labels.sizes().vec(), {}});
    append_raw(out.back().data, labels.data_ptr<int64_t>(),
               static_cast<std::size_t>(labels.numel()));
  }
  if (outputs.count("label_names")) {
    out.push_back({"label_names", "BYTES", labels.sizes().vec(), {}});
    auto& d = out.back().data;
    const int64_t* l = labels.data_ptr<int64_t>();
    for (int64_t i = 0; i < labels.numel(); ++i) {
      const std::string s = image::label_name(id2label, l[i]);
      const auto len = static_cast<std::uint32_t>(s.size());
      d.append(reinterpret_cast<const char*>(&len), 4);
      d.append(s);
    }
  }
  return out;
}

std::vector<api::TensorMetadata> classifier_input_metadata() {
  return {{"images", "BYTES", {-1, 1}, true}, {"pixel_values", "FP32", {-1, 3, -1, -1}, true}};
}

std::vector<api::TensorMetadata> classifier_output_metadata(int64_t num_labels) {
  return {{"logits", "FP32", {-1, num_labels}},
          {"probabilities", "FP32", {-1, num_labels}},
          {"scores", "FP32", {-1, -1}},
          {"labels", "INT64", {-1, -1}},
          {"label_names", "BYTES", {-1, -1}}};
}

}  // namespace libreyolo::server
