// The tests' one safetensors writer (header-only, test-only; the library reads the format in
// models/core/safetensors.h). The format (huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}}, then the
// tensors' bytes, little-endian, row-major.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/core/safetensors.h"

namespace libreyolo::test {

/// Named tensors in the order their bytes are written (names unique).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// The file image of a header text and data as given: any text, so that the hostile-file tests
/// write malformed headers through it too.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

/// The safetensors dtype name of a scalar type, as the library's reader maps the names
/// (models::core::to_scalar_type); throws std::runtime_error for a type it does not read.
inline const char* safetensors_dtype(at::ScalarType t) {
  using models::core::DType;
  for (int d = static_cast<int>(DType::BOOL); d <= static_cast<int>(DType::F8_E5M2); ++d)
    if (models::core::to_scalar_type(static_cast<DType>(d)) == t)
      return models::core::dtype_name(static_cast<DType>(d));
  throw std::runtime_error(std::string("safetensors writer: unsupported dtype ") +
                           c10::toString(t));
}

/// The file image of `tensors`: each one's dtype, shape and bytes (of a CPU contiguous copy).
inline std::string safetensors_bytes(const NamedTensors& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const auto c = t.detach().cpu().contiguous();
    const size_t bytes = c.numel() * c.element_size();
    header[name] = {{"dtype", safetensors_dtype(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(c.data_ptr()), bytes);
  }
  return safetensors_bytes(header.dump(), data);
}

/// Writes safetensors_bytes(tensors) to `path`; throws std::runtime_error naming the path.
inline void write_safetensors(const std::string& path, const NamedTensors& tensors) {
  const std::string bytes = safetensors_bytes(tensors);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error(path + ": cannot write the safetensors file");
}

}  // namespace libreyolo::test
