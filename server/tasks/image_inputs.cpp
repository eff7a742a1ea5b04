#include "server/tasks/image_inputs.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstring>

namespace libreyolo::server {
namespace {

int64_t element_size(const std::string& dt) {
  if (dt == "FP32" || dt == "INT32" || dt == "UINT32") return 4;
  if (dt == "FP64" || dt == "INT64" || dt == "UINT64") return 8;
  if (dt == "FP16" || dt == "BF16" || dt == "INT16" || dt == "UINT16") return 2;
  if (dt == "INT8" || dt == "UINT8" || dt == "BOOL") return 1;
  return 0;
}

void check_batch(const api::InputTensor& t, int64_t n, const RequestLimits& limits) {
  if (n == 0) invalid_argument("input '" + t.name + "': empty batch (N = 0)");
  if (n > limits.max_images) {
    invalid_argument(c10::str("input '", t.name, "': ", n, " images exceed the limit of ",
                              limits.max_images, " per request (server.max_images_per_request)"));
  }
  if (n > limits.max_batch_size) {
    invalid_argument(c10::str("input '", t.name, "': batch of ", n,
                              " exceeds the model's max_batch_size ", limits.max_batch_size));
  }
}

void parse_images(const api::InputTensor& t, const RequestLimits& limits, ImageInputs& r) {
  if (t.datatype != "BYTES")
    invalid_argument("input 'images': datatype " + t.datatype + ", expected BYTES");
  // [N] (OIP) or [N,1] (Triton's convention for a batched scalar BYTES input).
  if (t.shape.size() != 1 && !(t.shape.size() == 2 && t.shape[1] == 1)) {
    invalid_argument("input 'images': shape " + shape_str(t.shape) + ", expected [N]");
  }
  if (t.shape[0] < 0)
    invalid_argument("input 'images': shape " + shape_str(t.shape) + " has a negative dimension");
  check_batch(t, t.shape[0], limits);
  r.images = split_bytes(t);
  if (static_cast<int64_t>(r.images.size()) != t.shape[0]) {
    invalid_argument(c10::str("input 'images': shape ", shape_str(t.shape), " says ", t.shape[0],
                              " elements but the BYTES data holds ", r.images.size()));
  }
  for (std::size_t i = 0; i < r.images.size(); ++i) {
    if (r.images[i].empty())
      invalid_argument(c10::str("input 'images': image ", i, " is empty (0 bytes)"));
  }
  r.batch = t.shape[0];
}

/// INVALID_ARGUMENT naming the first NaN or infinity of host FP32 pixels `data` of shape `sizes`
/// (N, 3, H, W): such pixels are a client's bug, and what a model makes of them depends on the
/// kernels (oneDNN's fused ReLU turns NaN into 0, ATen's keeps it), so they are refused, not
/// answered with detections of garbage. A plain pass over the bytes (about 0.3 ms per 640x640
/// image on one core). CUDA shared-memory inputs are not read on the host and not checked.
void check_finite(std::string_view data, const std::vector<int64_t>& sizes) {
  const std::size_t n = data.size() / sizeof(float);
  for (std::size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, data.data() + i * sizeof(float), sizeof(float));
    if (std::isfinite(v)) continue;
    const auto hw = static_cast<std::size_t>(sizes[2] * sizes[3]);
    const std::size_t image = i / (3 * hw), channel = i / hw % 3, y = i % hw / sizes[3],
                      x = i % static_cast<std::size_t>(sizes[3]);
    invalid_argument(c10::str("input 'pixel_values': image ", image, " holds ",
                              std::isnan(v) ? "NaN" : (v > 0 ? "+inf" : "-inf"), " at channel ",
                              channel, ", y ", y, ", x ", x, " (pixels must be finite)"));
  }
}

void parse_pixels(const api::InputTensor& t, const RequestLimits& limits, ImageInputs& r) {
  if (t.datatype != "FP32")
    invalid_argument("input 'pixel_values': datatype " + t.datatype + ", expected FP32");
  if (t.shape.size() != 4 || t.shape[1] != 3) {
    invalid_argument("input 'pixel_values': shape " + shape_str(t.shape) + ", expected [N,3,H,W]");
  }
  if (t.shape[0] == 0) invalid_argument("input 'pixel_values': empty batch (N = 0)");
  if (t.shape[2] <= 0 || t.shape[3] <= 0) {
    invalid_argument("input 'pixel_values': shape " + shape_str(t.shape) + " has an empty image");
  }
  // Each side first: the product of two huge sides overflows int64 (undefined behaviour).
  if (t.shape[2] > limits.max_pixels || t.shape[3] > limits.max_pixels ||
      t.shape[2] > limits.max_pixels / t.shape[3]) {
    invalid_argument(c10::str("input 'pixel_values': ", t.shape[3], "x", t.shape[2],
                              " pixels per image exceed the limit of ", limits.max_pixels));
  }
  if (limits.max_model_pixels > 0 && t.shape[2] * t.shape[3] > limits.max_model_pixels) {
    invalid_argument(c10::str("input 'pixel_values': shape ", shape_str(t.shape), ": ", t.shape[3],
                              "x", t.shape[2], " = ", t.shape[2] * t.shape[3],
                              " pixels per image exceed the model's limit of ",
                              limits.max_model_pixels, " (", limits.model_pixels_reason, ")"));
  }
  check_batch(t, t.shape[0], limits);
  check_fixed(t, "FP32", 4, "[N,3,H,W]");
  const std::vector<int64_t> sizes = {t.shape[0], 3, t.shape[2], t.shape[3]};
  if (t.on_device()) {
    // CUDA shared memory (api::InputTensor::device_data): the client's device buffer as the
    // tensor, no host copy. The transport holds the region until the call ends, and the call
    // ends after the forward that reads it (ModelInstance::finish answers after the stream event).
    r.pixel_values = at::from_blob(
        const_cast<void*>(t.device_data), sizes,
        at::TensorOptions().dtype(at::kFloat).device(at::Device(at::kCUDA, t.device_index)));
  } else {
    const auto data = t.data();
    check_finite(data, sizes);
    r.pixel_values = at::empty(sizes, at::kFloat);
    std::memcpy(r.pixel_values.data_ptr<float>(), data.data(), data.size());
  }
  r.batch = t.shape[0];
}

}  // namespace

std::vector<std::string_view> split_bytes(const api::InputTensor& t) {
  std::vector<std::string_view> out;
  std::string_view d = t.data();
  std::size_t at = 0;
  while (at < d.size()) {
    if (d.size() - at < 4) {
      invalid_argument(c10::str("input '", t.name, "': BYTES data is malformed: ", d.size() - at,
                                " trailing bytes are too short for an element length"));
    }
    std::uint32_t n = 0;
    std::memcpy(&n, d.data() + at, 4);
    at += 4;
    if (n > d.size() - at) {
      invalid_argument(c10::str("input '", t.name, "': BYTES data is malformed: element ",
                                out.size(), " claims ", n, " bytes but only ", d.size() - at,
                                " remain"));
    }
    out.push_back(d.substr(at, n));
    at += n;
  }
  return out;
}

std::pair<int64_t, std::string> model_pixel_limit(int64_t height, int64_t width,
                                                  int64_t shortest_edge, int64_t longest_edge,
                                                  bool do_resize) {
  constexpr int64_t f2 = kModelPixelsFactor * kModelPixelsFactor;
  // Sizes come from a checkpoint file: bounded before multiplying (2^20 pixels a side is
  // far beyond any processor, and the product stays within int64).
  auto sane = [](int64_t v) { return v > 0 && v <= (int64_t{1} << 20); };
  if (!do_resize) return {0, ""};
  if (sane(height) && sane(width)) {
    return {f2 * height * width, c10::str(f2, " x the model's ", width, "x", height,
                                          " input size, preprocessor_config.json size")};
  }
  if (sane(longest_edge)) {
    return {f2 * longest_edge * longest_edge,
            c10::str(f2, " x the square of the model's longest_edge ", longest_edge,
                     ", preprocessor_config.json size")};
  }
  (void)shortest_edge;  // the long side is not bounded by the processor: no bound
  return {0, ""};
}

void invalid_argument(const std::string& message) {
  throw api::Error(api::Code::invalid_argument, message);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t check_fixed(const api::InputTensor& t, const std::string& datatype, std::size_t rank,
                    const std::string& expected_shape) {
  if (t.datatype != datatype) {
    invalid_argument("input '" + t.name + "': datatype " + t.datatype + ", expected " + datatype);
  }
  if (t.shape.size() != rank) {
    invalid_argument("input '" + t.name + "': shape " + shape_str(t.shape) + ", expected " +
                     expected_shape);
  }
  int64_t count = 1;
  for (auto d : t.shape) {
    if (d < 0)
      invalid_argument("input '" + t.name + "': shape " + shape_str(t.shape) +
                       " has a negative dimension");
    if (d > 0 && count > (int64_t{1} << 40) / d)
      invalid_argument("input '" + t.name + "': shape " + shape_str(t.shape) + " is too large");
    count *= d;
  }
  const int64_t bytes = count * element_size(datatype);
  if (static_cast<int64_t>(t.byte_size()) != bytes) {
    invalid_argument(c10::str("input '", t.name, "': shape ", shape_str(t.shape), " needs ", bytes,
                              " bytes of ", datatype, ", got ", t.byte_size()));
  }
  return count;
}

double number_param(const std::string& key, const api::Parameter& p) {
  if (auto* d = std::get_if<double>(&p)) return *d;
  if (auto* i = std::get_if<std::int64_t>(&p)) return static_cast<double>(*i);
  if (auto* u = std::get_if<std::uint64_t>(&p)) return static_cast<double>(*u);
  invalid_argument("parameter '" + key + "' must be a number (double_param or int64_param)");
}

std::int64_t top_k_param(const api::Parameter& p, std::int64_t model_default) {
  const double k = number_param("top_k", p);  // refuses strings and bools
  std::string got;
  if (auto* i = std::get_if<std::int64_t>(&p)) {
    got = std::to_string(*i);
  } else if (auto* u = std::get_if<std::uint64_t>(&p)) {
    got = std::to_string(*u);
  } else {
    got = c10::str(k);
  }
  // Integral and in range, checked on the double (exact for every value up to 2^53), so that
  // NaN, infinities and 2^64-1 all fail here before any conversion.
  if (!(k >= 0 && k <= static_cast<double>(kMaxTopK)) || k != std::floor(k)) {
    invalid_argument(c10::str("parameter 'top_k' must be an integer from 0 to ", kMaxTopK,
                              " (0: the model's default), got ", got));
  }
  const auto v = static_cast<std::int64_t>(k);
  return v == 0 ? model_default : v;
}

double finite_param(const std::string& key, const api::Parameter& p) {
  const double t = number_param(key, p);
  if (!std::isfinite(t))
    invalid_argument(c10::str("parameter '", key, "' must be a finite number, got ", t));
  return t;
}

const char* param_type_name(const api::Parameter& p) {
  switch (p.index()) {
    case 0:
      return "bool";
    case 1:
      return "int64";
    case 2:
      return "string";
    case 3:
      return "double";
    default:
      return "uint64";
  }
}

double threshold_param(const api::Parameter& p) { return finite_param("threshold", p); }

ImageInputs parse_image_inputs(const api::InputTensor* images, const api::InputTensor* pixels,
                               const RequestLimits& limits) {
  if (!images && !pixels)
    invalid_argument("missing input: send 'images' (BYTES [N]) or 'pixel_values' (FP32 [N,3,H,W])");
  if (images && pixels)
    invalid_argument("inputs 'images' and 'pixel_values' are exclusive; send one");
  ImageInputs r;
  if (images)
    parse_images(*images, limits, r);
  else
    parse_pixels(*pixels, limits, r);
  return r;
}

}  // namespace libreyolo::server
