// The image inputs every task shares (DESIGN.md "Serving"): `images` BYTES [N] or [N,1] (encoded
// JPEG/PNG) and `pixel_values` FP32 [N,3,H,W], with one set of checks and messages, plus the
// small helpers of the tasks' I/O files (detector_io, classifier_io).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/types.h"

namespace libreyolo::server {

/// Per-request limits, checked before any work (server.yaml and the model's serving.yaml).
struct RequestLimits {
  int64_t max_images = 64;        ///< N per request
  int64_t max_pixels = 40000000;  ///< width * height per image
  int64_t max_batch_size = 8;     ///< the model's max_batch_size
};

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

/// Parses the one of `images` / `pixel_values` that is non-null (INVALID_ARGUMENT when neither
/// or both are): BYTES elements split by their 4-byte little-endian lengths, non-empty; or
/// FP32 pixels copied into a tensor. N must be >= 1 and within `limits` (max_images,
/// max_batch_size), H*W within max_pixels. Throws INVALID_ARGUMENT naming the input and the
/// problem.
ImageInputs parse_image_inputs(const api::InputTensor* images, const api::InputTensor* pixels,
                               const RequestLimits& limits);

/// Appends the raw bytes of `n` values (little-endian hosts: the OIP raw output layout).
template <class T>
void append_raw(std::string& out, const T* data, std::size_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(T));
}

}  // namespace libreyolo::server
