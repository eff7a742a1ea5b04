#include "server/tasks/detector_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

namespace libreyolo::server {
const std::vector<std::string>& detector_default_outputs() {
  static const std::vector<std::string> names = {"scores", "labels", "boxes", "num_detections",
                                                 "label_names"};
  return names;
}

DetectorRequest parse_detector_request(const api::InferRequest& request,
                                       const RequestLimits& limits, double default_threshold,
                                       int64_t default_top_k,
                                       const std::vector<std::string>& extra_outputs,
                                       const std::vector<std::string>& extra_inputs) {
  DetectorRequest r;
  r.post.threshold = default_threshold;
  r.post.top_k = default_top_k;
  for (const auto& [key, value] : request.parameters) {
    if (key == "threshold") {
      r.post.threshold = threshold_param(value);
    } else if (key == "top_k") {
      r.post.top_k = top_k_param(value, default_top_k);
    }
    // Other parameters (Triton's priority/timeout/binary_data_output...) are ignored.
  }
  const api::InputTensor* images = nullptr;
  const api::InputTensor* pixels = nullptr;
  const api::InputTensor* sizes = nullptr;
  for (const auto& t : request.inputs) {
    if (std::find(extra_inputs.begin(), extra_inputs.end(), t.name) != extra_inputs.end()) continue;
    const api::InputTensor** slot = t.name == "images"         ? &images
                                    : t.name == "pixel_values" ? &pixels
                                    : t.name == "target_sizes" ? &sizes
                                                               : nullptr;
    if (!slot)
      invalid_argument("unexpected input '" + t.name +
                       "' (expected images or pixel_values, optional target_sizes)");
    if (*slot) invalid_argument("input '" + t.name + "' is given twice");
    *slot = &t;
  }
  static_cast<ImageInputs&>(r) = parse_image_inputs(images, pixels, limits);
  if (sizes) {
    check_fixed(*sizes, "INT64", 2, "[N,2]");
    if (sizes->shape[0] != r.batch || sizes->shape[1] != 2) {
      invalid_argument(c10::str("input 'target_sizes': shape ", shape_str(sizes->shape),
                                ", expected [", r.batch, ",2]"));
    }
    const auto d = sizes->data();
    for (int64_t i = 0; i < r.batch; ++i) {
      int64_t hw[2];
      std::memcpy(hw, d.data() + i * 16, 16);
      if (hw[0] <= 0 || hw[1] <= 0)
        invalid_argument(c10::str("input 'target_sizes': row ", i, " is not positive"));
      // The boxes (and masks) are scaled to this size: the image budget bounds it as it bounds
      // an input image, each side first (the product of two huge sides overflows int64).
      if (hw[0] > limits.max_pixels || hw[1] > limits.max_pixels ||
          hw[0] > limits.max_pixels / hw[1]) {
        invalid_argument(c10::str("input 'target_sizes': row ", i, " (height ", hw[0], ", width ",
                                  hw[1], ") exceeds the limit of ", limits.max_pixels,
                                  " pixels per image (server.max_pixels_per_image)"));
      }
      r.target_sizes.emplace_back(hw[0], hw[1]);
    }
  }
  std::vector<std::string> known = {"scores",      "labels", "boxes",     "num_detections",
                                    "label_names", "logits", "pred_boxes"};
  known.insert(known.end(), extra_outputs.begin(), extra_outputs.end());
  for (const auto& o : request.requested_outputs) {
    if (std::find(known.begin(), known.end(), o) == known.end())
      invalid_argument("unknown output '" + o + "' (available: " + c10::Join(", ", known) + ")");
    r.outputs.insert(o);
  }
  if (r.outputs.empty())
    r.outputs.insert(detector_default_outputs().begin(), detector_default_outputs().end());
  return r;
}

std::vector<api::OutputTensor> detector_outputs(const std::vector<image::Detections>& detections,
                                                const at::Tensor& logits,
                                                const at::Tensor& pred_boxes,
                                                const std::map<int64_t, std::string>& id2label,
                                                const std::set<std::string>& outputs) {
  const int64_t n = static_cast<int64_t>(detections.size());
  int64_t k = 0;
  for (const auto& d : detections) k = std::max<int64_t>(k, d.scores.size(0));
  std::vector<float> scores(n * k, 0.f), boxes(n * k * 4, 0.f);
  std::vector<int64_t> labels(n * k, -1);
  std::vector<int32_t> counts(n, 0);
  std::vector<std::string> names(n * k);
  for (int64_t i = 0; i < n; ++i) {
    const auto s = detections[i].scores.contiguous().to(at::kFloat);
    const auto l = detections[i].labels.contiguous().to(at::kLong);
    const auto b = detections[i].boxes.contiguous().to(at::kFloat);
    const int64_t m = s.size(0);
    counts[i] = static_cast<int32_t>(m);
    // With no detection in the whole batch (k == 0) the vectors are empty and data() may be
    // null: memcpy(nullptr, ..., 0) is undefined behaviour (oip_request_fuzz,
    // tests/fuzz/corpus/oip_request/regress-no-detection.pb).
    if (m == 0) continue;
    std::memcpy(scores.data() + i * k, s.data_ptr<float>(), m * sizeof(float));
    std::memcpy(labels.data() + i * k, l.data_ptr<int64_t>(), m * sizeof(int64_t));
    std::memcpy(boxes.data() + i * k * 4, b.data_ptr<float>(), m * 4 * sizeof(float));
    for (int64_t j = 0; j < m; ++j)
      names[i * k + j] = image::label_name(id2label, labels[i * k + j]);
  }
  std::vector<api::OutputTensor> out;
  auto add = [&](const char* name, const char* dt, std::vector<int64_t> shape) -> std::string* {
    if (!outputs.count(name)) return nullptr;
    out.push_back({name, dt, std::move(shape), {}});
    return &out.back().data;
  };
  if (auto* d = add("scores", "FP32", {n, k})) append_raw(*d, scores.data(), scores.size());
  if (auto* d = add("labels", "INT64", {n, k})) append_raw(*d, labels.data(), labels.size());
  if (auto* d = add("boxes", "FP32", {n, k, 4})) append_raw(*d, boxes.data(), boxes.size());
  if (auto* d = add("num_detections", "INT32", {n})) append_raw(*d, counts.data(), counts.size());
  if (auto* d = add("label_names", "BYTES", {n, k})) {
    for (const auto& s : names) {
      const auto len = static_cast<std::uint32_t>(s.size());
      d->append(reinterpret_cast<const char*>(&len), 4);
      d->append(s);
    }
  }
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"logits", &logits},
                                {"pred_boxes", &pred_boxes}}) {
    if (!outputs.count(name) || !t->defined()) continue;
    const auto c = t->contiguous().to(at::kFloat);
    if (auto* d = add(name, "FP32", c.sizes().vec()))
      append_raw(*d, c.data_ptr<float>(), c.numel());
  }
  return out;
}

std::vector<api::TensorMetadata> detector_input_metadata() {
  return {{"images", "BYTES", {-1, 1}, true},
          {"pixel_values", "FP32", {-1, 3, -1, -1}, true},
          {"target_sizes", "INT64", {-1, 2}, true}};
}

std::vector<api::TensorMetadata> detector_output_metadata(int64_t num_queries, int64_t num_labels) {
  return {{"scores", "FP32", {-1, -1}},
          {"labels", "INT64", {-1, -1}},
          {"boxes", "FP32", {-1, -1, 4}},
          {"num_detections", "INT32", {-1}},
          {"label_names", "BYTES", {-1, -1}},
          {"logits", "FP32", {-1, num_queries, num_labels}},
          {"pred_boxes", "FP32", {-1, num_queries, 4}}};
}

}  // namespace libreyolo::server
