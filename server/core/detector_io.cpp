#include "server/core/detector_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

namespace libreyolo::server {
namespace {

using api::Code;
using api::Error;

[[noreturn]] void bad(const std::string& msg) { throw Error(Code::invalid_argument, msg); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t element_size(const std::string& dt) {
  if (dt == "FP32" || dt == "INT32" || dt == "UINT32") return 4;
  if (dt == "FP64" || dt == "INT64" || dt == "UINT64") return 8;
  if (dt == "FP16" || dt == "BF16" || dt == "INT16" || dt == "UINT16") return 2;
  if (dt == "INT8" || dt == "UINT8" || dt == "BOOL") return 1;
  return 0;
}

/// Checks datatype, rank and dims >= 0 of a fixed-size tensor; returns the element count.
int64_t check_fixed(const api::InputTensor& t, const std::string& datatype, std::size_t rank,
                    const std::string& expected_shape) {
  if (t.datatype != datatype) {
    bad("input '" + t.name + "': datatype " + t.datatype + ", expected " + datatype);
  }
  if (t.shape.size() != rank) {
    bad("input '" + t.name + "': shape " + shape_str(t.shape) + ", expected " + expected_shape);
  }
  int64_t count = 1;
  for (auto d : t.shape) {
    if (d < 0)
      bad("input '" + t.name + "': shape " + shape_str(t.shape) + " has a negative dimension");
    if (d > 0 && count > (int64_t{1} << 40) / d)
      bad("input '" + t.name + "': shape " + shape_str(t.shape) + " is too large");
    count *= d;
  }
  const int64_t bytes = count * element_size(datatype);
  if (static_cast<int64_t>(t.data().size()) != bytes) {
    bad(c10::str("input '", t.name, "': shape ", shape_str(t.shape), " needs ", bytes, " bytes of ",
                 datatype, ", got ", t.data().size()));
  }
  return count;
}

std::vector<std::string_view> split_bytes(const api::InputTensor& t) {
  std::vector<std::string_view> out;
  std::string_view d = t.data();
  std::size_t at = 0;
  while (at < d.size()) {
    if (d.size() - at < 4) {
      bad(c10::str("input '", t.name, "': BYTES data is malformed: ", d.size() - at,
                   " trailing bytes are too short for an element length"));
    }
    std::uint32_t n = 0;
    std::memcpy(&n, d.data() + at, 4);
    at += 4;
    if (n > d.size() - at) {
      bad(c10::str("input '", t.name, "': BYTES data is malformed: element ", out.size(),
                   " claims ", n, " bytes but only ", d.size() - at, " remain"));
    }
    out.push_back(d.substr(at, n));
    at += n;
  }
  return out;
}

double number_param(const std::string& key, const api::Parameter& p) {
  if (auto* d = std::get_if<double>(&p)) return *d;
  if (auto* i = std::get_if<std::int64_t>(&p)) return static_cast<double>(*i);
  if (auto* u = std::get_if<std::uint64_t>(&p)) return static_cast<double>(*u);
  bad("parameter '" + key + "' must be a number (double_param or int64_param)");
}

void check_batch(const api::InputTensor& t, int64_t n, const RequestLimits& limits) {
  if (n == 0) bad("input '" + t.name + "': empty batch (N = 0)");
  if (n > limits.max_images) {
    bad(c10::str("input '", t.name, "': ", n, " images exceed the limit of ", limits.max_images,
                 " per request (server.max_images_per_request)"));
  }
  if (n > limits.max_batch_size) {
    bad(c10::str("input '", t.name, "': batch of ", n, " exceeds the model's max_batch_size ",
                 limits.max_batch_size));
  }
}

template <class T>
void put(std::string& out, const T* data, std::size_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(T));
}

}  // namespace

const std::vector<std::string>& detector_default_outputs() {
  static const std::vector<std::string> names = {"scores", "labels", "boxes", "num_detections",
                                                 "label_names"};
  return names;
}

DetectorRequest parse_detector_request(const api::InferRequest& request,
                                       const RequestLimits& limits, double default_threshold,
                                       int64_t default_top_k) {
  DetectorRequest r;
  r.post.threshold = default_threshold;
  r.post.top_k = default_top_k;
  for (const auto& [key, value] : request.parameters) {
    if (key == "threshold") {
      r.post.threshold = number_param(key, value);
    } else if (key == "top_k") {
      const double k = number_param(key, value);
      if (k < 0 || k != static_cast<double>(static_cast<int64_t>(k))) {
        bad("parameter 'top_k' must be a non-negative integer");
      }
      r.post.top_k = static_cast<int64_t>(k);
    }
    // Other parameters (Triton's priority/timeout/binary_data_output...) are ignored.
  }
  const api::InputTensor* images = nullptr;
  const api::InputTensor* pixels = nullptr;
  const api::InputTensor* sizes = nullptr;
  for (const auto& t : request.inputs) {
    const api::InputTensor** slot = t.name == "images"         ? &images
                                    : t.name == "pixel_values" ? &pixels
                                    : t.name == "target_sizes" ? &sizes
                                                               : nullptr;
    if (!slot)
      bad("unexpected input '" + t.name +
          "' (expected images or pixel_values, optional target_sizes)");
    if (*slot) bad("input '" + t.name + "' is given twice");
    *slot = &t;
  }
  if (!images && !pixels)
    bad("missing input: send 'images' (BYTES [N]) or 'pixel_values' (FP32 [N,3,H,W])");
  if (images && pixels) bad("inputs 'images' and 'pixel_values' are exclusive; send one");
  if (images) {
    const auto& t = *images;
    if (t.datatype != "BYTES") bad("input 'images': datatype " + t.datatype + ", expected BYTES");
    // [N] (OIP) or [N,1] (Triton's convention for a batched scalar BYTES input).
    if (t.shape.size() != 1 && !(t.shape.size() == 2 && t.shape[1] == 1)) {
      bad("input 'images': shape " + shape_str(t.shape) + ", expected [N]");
    }
    check_batch(t, t.shape[0], limits);
    r.images = split_bytes(t);
    if (static_cast<int64_t>(r.images.size()) != t.shape[0]) {
      bad(c10::str("input 'images': shape ", shape_str(t.shape), " says ", t.shape[0],
                   " elements but the BYTES data holds ", r.images.size()));
    }
    for (std::size_t i = 0; i < r.images.size(); ++i) {
      if (r.images[i].empty()) bad(c10::str("input 'images': image ", i, " is empty (0 bytes)"));
    }
    r.batch = t.shape[0];
  } else {
    const auto& t = *pixels;
    if (t.datatype != "FP32")
      bad("input 'pixel_values': datatype " + t.datatype + ", expected FP32");
    if (t.shape.size() != 4 || t.shape[1] != 3) {
      bad("input 'pixel_values': shape " + shape_str(t.shape) + ", expected [N,3,H,W]");
    }
    if (t.shape[0] == 0) bad("input 'pixel_values': empty batch (N = 0)");
    if (t.shape[2] <= 0 || t.shape[3] <= 0) {
      bad("input 'pixel_values': shape " + shape_str(t.shape) + " has an empty image");
    }
    if (t.shape[2] * t.shape[3] > limits.max_pixels) {
      bad(c10::str("input 'pixel_values': ", t.shape[3], "x", t.shape[2],
                   " pixels per image exceed the limit of ", limits.max_pixels));
    }
    check_batch(t, t.shape[0], limits);
    check_fixed(t, "FP32", 4, "[N,3,H,W]");
    auto data = t.data();
    r.pixel_values = at::empty({t.shape[0], 3, t.shape[2], t.shape[3]}, at::kFloat);
    std::memcpy(r.pixel_values.data_ptr<float>(), data.data(), data.size());
    r.batch = t.shape[0];
  }
  if (sizes) {
    check_fixed(*sizes, "INT64", 2, "[N,2]");
    if (sizes->shape[0] != r.batch || sizes->shape[1] != 2) {
      bad(c10::str("input 'target_sizes': shape ", shape_str(sizes->shape), ", expected [", r.batch,
                   ",2]"));
    }
    const auto d = sizes->data();
    for (int64_t i = 0; i < r.batch; ++i) {
      int64_t hw[2];
      std::memcpy(hw, d.data() + i * 16, 16);
      if (hw[0] <= 0 || hw[1] <= 0)
        bad(c10::str("input 'target_sizes': row ", i, " is not positive"));
      r.target_sizes.emplace_back(hw[0], hw[1]);
    }
  }
  static const std::set<std::string> known = {
      "scores", "labels", "boxes", "num_detections", "label_names", "logits", "pred_boxes"};
  for (const auto& o : request.requested_outputs) {
    if (!known.count(o)) {
      bad("unknown output '" + o +
          "' (available: scores, labels, boxes, num_detections, label_names, logits, pred_boxes)");
    }
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
  if (auto* d = add("scores", "FP32", {n, k})) put(*d, scores.data(), scores.size());
  if (auto* d = add("labels", "INT64", {n, k})) put(*d, labels.data(), labels.size());
  if (auto* d = add("boxes", "FP32", {n, k, 4})) put(*d, boxes.data(), boxes.size());
  if (auto* d = add("num_detections", "INT32", {n})) put(*d, counts.data(), counts.size());
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
    if (auto* d = add(name, "FP32", c.sizes().vec())) put(*d, c.data_ptr<float>(), c.numel());
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
