// The image inputs every task shares (DESIGN.md "Serving"): `images` BYTES [N] or [N,1] (encoded
// JPEG/PNG) and `pixel_values` FP32 [N,3,H,W], with one set of checks and messages, plus the
// small helpers of the tasks' I/O files (detector_io, classifier_io).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/api/types.h"

namespace libreyolo::server {

/// Per-request limits, checked before any work (server.yaml and the model's serving.yaml).
struct RequestLimits {
  int64_t max_images = 64;        ///< N per request
  int64_t max_pixels = 40000000;  ///< width * height per image
  int64_t max_batch_size = 8;     ///< the model's max_batch_size
  /// `pixel_values` only: the largest H * W the model takes (model_pixel_limit); 0: no bound
  /// beyond max_pixels. Encoded `images` are resized by the processor and need none.
  int64_t max_model_pixels = 0;
  std::string model_pixels_reason;  ///< how max_model_pixels was derived (the error message)
};

/// Every side of a `pixel_values` input may be this many times the model's input size:
/// its H * W at most kModelPixelsFactor^2 times the processor's (ViT/Swin attention memory
/// grows with tokens^2, RT-DETR's encoder attention as well).
constexpr int64_t kModelPixelsFactor = 2;

/// The pixel_values bound of a model from its preprocessor_config.json `size`: {height, width}
/// (ViT, Swin, RT-DETR): 4 * height * width; {shortest_edge, longest_edge} (Deformable DETR):
/// 4 * longest_edge^2; shortest_edge alone, or no resize: 0 (no bound: the processor itself
/// does not bound the long side). Returns (limit, reason), e.g. (200704, "4 x the model's
/// 224x224 input size (preprocessor_config.json size)").
std::pair<int64_t, std::string> model_pixel_limit(int64_t height, int64_t width,
                                                  int64_t shortest_edge, int64_t longest_edge,
                                                  bool do_resize);

/// The validated image input of a request (views into the api::InferRequest: keep it alive).
struct ImageInputs {
  std::vector<std::string_view> images;  ///< encoded images, when `images` was sent
  at::Tensor pixel_values;               ///< (N,3,H,W) float32 CPU, when `pixel_values` was sent
  int64_t batch = 0;                     ///< N
};

/// Throws api::Error INVALID_ARGUMENT with `message`.
[[noreturn]] void invalid_argument(const std::string& message);

/// "[1,3,640,640]".
std::string shape_str(const std::vector<int64_t>& shape);

/// Checks datatype, rank, dims >= 0, a total below 2^40 elements and the byte size of a
/// fixed-size tensor; returns the element count. Throws INVALID_ARGUMENT naming the input.
int64_t check_fixed(const api::InputTensor& t, const std::string& datatype, std::size_t rank,
                    const std::string& expected_shape);

/// A numeric request parameter (double_param, int64_param or uint64_param) as a double.
/// Throws INVALID_ARGUMENT naming `key` for any other type.
double number_param(const std::string& key, const api::Parameter& p);

/// Largest request parameter `top_k` accepted (detectors and classifiers alike). K is capped at
/// the candidates anyway (queries, queries x classes, classes): the bound only refuses nonsense.
constexpr std::int64_t kMaxTopK = 1000000000;

/// The request parameter `top_k`, one rule for every task (server/README.md "Request
/// parameters"): an integer from 0 to kMaxTopK given as int64_param, uint64_param or an integral
/// double_param; 0 means the model's default (serving.yaml `top_k`, as if not sent). Throws
/// INVALID_ARGUMENT "parameter 'top_k' must be an integer from 0 to 1000000000 (0: the model's
/// default), got <value>" otherwise (negative, fractional, NaN, infinite, larger).
std::int64_t top_k_param(const api::Parameter& p, std::int64_t model_default);

/// The request parameter `threshold` (detectors): a finite number, as serving.yaml's
/// `threshold` must be. Throws INVALID_ARGUMENT "parameter 'threshold' must be a finite
/// number, got nan" (or inf, -inf); a non-number as number_param does.
double threshold_param(const api::Parameter& p);

/// A finite numeric request parameter `key` (threshold, mask_threshold). Throws
/// INVALID_ARGUMENT "parameter '<key>' must be a finite number, got nan" (or inf, -inf); a
/// non-number as number_param does.
double finite_param(const std::string& key, const api::Parameter& p);

/// The name of a request parameter's type for error messages: "bool", "int64", "string",
/// "double" or "uint64" (api::Parameter's alternatives).
const char* param_type_name(const api::Parameter& p);

/// Parses the one of `images` / `pixel_values` that is non-null (INVALID_ARGUMENT when neither
/// or both are): BYTES elements split by their 4-byte little-endian lengths, non-empty; or
/// FP32 pixels copied into a tensor. N must be >= 1 and within `limits` (max_images,
/// max_batch_size), H*W within max_pixels and, for pixel_values, within max_model_pixels.
/// Throws INVALID_ARGUMENT naming the input and the problem (shape and limit included).
ImageInputs parse_image_inputs(const api::InputTensor* images, const api::InputTensor* pixels,
                               const RequestLimits& limits);

/// The elements of a BYTES input (each a 4-byte little-endian length, then the bytes), as views
/// into its data. Throws INVALID_ARGUMENT naming the input for malformed data.
std::vector<std::string_view> split_bytes(const api::InputTensor& t);

/// Appends the raw bytes of `n` values (little-endian hosts: the OIP raw output layout).
template <class T>
void append_raw(std::string& out, const T* data, std::size_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(T));
}

}  // namespace libreyolo::server
