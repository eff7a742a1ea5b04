#include "server/core/classifier_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

namespace libreyolo::server {
namespace {

using api::Code;
using api::Error;

// The request checks mirror detector_io.cpp's (same messages, so clients see one vocabulary);
// they are repeated here rather than shared so that the detector path stays untouched.

[[noreturn]] void bad(const std::string& msg) { throw Error(Code::invalid_argument, msg); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
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

void parse_images(const api::InputTensor& t, const RequestLimits& limits, ClassifierRequest& r) {
  if (t.datatype != "BYTES") bad("input 'images': datatype " + t.datatype + ", expected BYTES");
  // [N] (OIP) or [N,1] (Triton's convention for a batched scalar BYTES input).
  if (t.shape.size() != 1 && !(t.shape.size() == 2 && t.shape[1] == 1)) {
    bad("input 'images': shape " + shape_str(t.shape) + ", expected [N]");
  }
  if (t.shape[0] < 0) bad("input 'images': shape " + shape_str(t.shape) + " is negative");
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
}

void parse_pixels(const api::InputTensor& t, const RequestLimits& limits, ClassifierRequest& r) {
  if (t.datatype != "FP32") bad("input 'pixel_values': datatype " + t.datatype + ", expected FP32");
  if (t.shape.size() != 4 || t.shape[1] != 3) {
    bad("input 'pixel_values': shape " + shape_str(t.shape) + ", expected [N,3,H,W]");
  }
  if (t.shape[0] < 0) bad("input 'pixel_values': shape " + shape_str(t.shape) + " is negative");
  if (t.shape[2] <= 0 || t.shape[3] <= 0) {
    bad("input 'pixel_values': shape " + shape_str(t.shape) + " has an empty image");
  }
  if (t.shape[2] > limits.max_pixels || t.shape[3] > limits.max_pixels ||
      t.shape[2] * t.shape[3] > limits.max_pixels) {
    bad(c10::str("input 'pixel_values': ", t.shape[3], "x", t.shape[2],
                 " pixels per image exceed the limit of ", limits.max_pixels));
  }
  check_batch(t, t.shape[0], limits);
  const int64_t bytes = t.shape[0] * 3 * t.shape[2] * t.shape[3] * 4;
  const auto data = t.data();
  if (static_cast<int64_t>(data.size()) != bytes) {
    bad(c10::str("input 'pixel_values': shape ", shape_str(t.shape), " needs ", bytes,
                 " bytes of FP32, got ", data.size()));
  }
  r.pixel_values = at::empty({t.shape[0], 3, t.shape[2], t.shape[3]}, at::kFloat);
  std::memcpy(r.pixel_values.data_ptr<float>(), data.data(), data.size());
  r.batch = t.shape[0];
}

template <class T>
void put(std::string& out, const T* data, std::size_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(T));
}

}  // namespace

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
    if (key == "top_k") {
      const double k = number_param(key, value);
      if (k < 1 || k > 1e9 || k != static_cast<double>(static_cast<int64_t>(k))) {
        bad("parameter 'top_k' must be a positive integer");
      }
      r.top_k = static_cast<int64_t>(k);
    }
  }
  const api::InputTensor* images = nullptr;
  const api::InputTensor* pixels = nullptr;
  for (const auto& t : request.inputs) {
    const api::InputTensor** slot = t.name == "images"         ? &images
                                    : t.name == "pixel_values" ? &pixels
                                                               : nullptr;
    if (!slot) {
      bad("unexpected input '" + t.name +
          "' (a classifier takes images (BYTES [N]) or pixel_values (FP32 [N,3,H,W]))");
    }
    if (*slot) bad("input '" + t.name + "' is given twice");
    *slot = &t;
  }
  if (!images && !pixels)
    bad("missing input: send 'images' (BYTES [N]) or 'pixel_values' (FP32 [N,3,H,W])");
  if (images && pixels) bad("inputs 'images' and 'pixel_values' are exclusive; send one");
  if (images)
    parse_images(*images, limits, r);
  else
    parse_pixels(*pixels, limits, r);
  const auto& known = classifier_default_outputs();
  for (const auto& o : request.requested_outputs) {
    if (std::find(known.begin(), known.end(), o) == known.end()) {
      bad("unknown output '" + o +
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
    put(out.back().data, c.data_ptr<float>(), static_cast<std::size_t>(c.numel()));
  };
  add_float("logits", logits);
  add_float("probabilities", classes.probabilities);
  add_float("scores", classes.scores);
  const auto labels = classes.labels.to(at::kCPU, at::kLong).contiguous();
  if (outputs.count("labels")) {
    out.push_back({"labels", "INT64", labels.sizes().vec(), {}});
    put(out.back().data, labels.data_ptr<int64_t>(), static_cast<std::size_t>(labels.numel()));
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
