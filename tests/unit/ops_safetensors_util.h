// Minimal safetensors reader for the ops tests (test-only; the library's reader lives in
// models/core/). Format (huggingface/safetensors): 8-byte little-endian header length N, N bytes
// of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// tensor bytes, offsets relative to the end of the header.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/tensor_diff.h"

namespace libreyolo::test {

/// Every tensor of a .safetensors file, as CPU tensors owning their memory. Supported dtypes:
/// F32, F64, F16, BF16, I64, I32, U8, BOOL. Throws std::runtime_error naming the file and key
/// on a malformed file.
inline std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) throw std::runtime_error(path + ": shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > bytes.size() - 8) throw std::runtime_error(path + ": header length too large");
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len);
  const size_t data_start = 8 + header_len;
  static const std::map<std::string, at::ScalarType> kDtypes = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},  {"I32", at::kInt},    {"U8", at::kByte},  {"BOOL", at::kBool}};
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const auto dtype_it = kDtypes.find(info.at("dtype").get<std::string>());
    if (dtype_it == kDtypes.end()) {
      throw std::runtime_error(path + ": " + name + ": unsupported dtype " +
                               info.at("dtype").get<std::string>());
    }
    const auto shape = info.at("shape").get<std::vector<int64_t>>();
    const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    auto t = at::empty(shape, at::TensorOptions().dtype(dtype_it->second));
    const uint64_t nbytes = t.numel() * t.element_size();
    if (offsets.size() != 2 || offsets[1] - offsets[0] != nbytes ||
        data_start + offsets[1] > bytes.size()) {
      throw std::runtime_error(path + ": " + name + ": data_offsets do not match dtype and shape");
    }
    if (nbytes > 0) std::memcpy(t.data_ptr(), bytes.data() + data_start + offsets[0], nbytes);
    out.emplace(name, std::move(t));
  }
  return out;
}

/// Path of a file under tests/fixtures.
inline std::string fixture_path(const std::string& relative) {
  return std::string(LIBREYOLO_TEST_FIXTURES) + "/" + relative;
}

}  // namespace libreyolo::test
