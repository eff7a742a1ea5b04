// Torch-free parsing and validation of a safetensors header
// (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header length N,
// N bytes of JSON {"key": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian tensor data. Kept free of LibTorch so that the libFuzzer target
// (tests/fuzz/) links only this file and nlohmann-json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace libreyolo::models::core {

/// Every error about a checkpoint file (corrupt safetensors, missing/unexpected/mis-shaped keys).
/// The message is one line naming the file and, where there is one, the tensor key.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element types of the safetensors format (names as written in the header).
enum class DType {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  I32,
  U32,
  I64,
  U64,
  F16,
  BF16,
  F32,
  F64,
  F8_E4M3,
  F8_E5M2
};

/// Bytes per element of `dtype`.
size_t itemsize(DType dtype);
/// Header spelling ("F32", ...).
const char* dtype_name(DType dtype);

/// One tensor's entry, validated: `end - begin == numel(shape) * itemsize(dtype)`, both offsets
/// inside the data section, and no overlap with any other tensor.
struct TensorInfo {
  std::string key;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< byte offset relative to the start of the data section
  uint64_t end = 0;    ///< one past the last byte, relative to the data section
  uint64_t numel() const;
};

/// A validated header.
struct Header {
  std::vector<TensorInfo> tensors;              ///< sorted by key
  std::map<std::string, std::string> metadata;  ///< "__metadata__" (string values only)
  uint64_t data_offset = 0;                     ///< 8 + N: absolute offset of the data section
  uint64_t data_size = 0;                       ///< file size - data_offset

  /// Entry for `key`, or nullptr.
  const TensorInfo* find(const std::string& key) const;
};

/// Parses and validates the header of a complete file image `bytes[0, size)`. Checks: file at
/// least 8 bytes, header length (assembled byte by byte, so endianness-independent) within the
/// file, valid JSON object, known dtypes, non-negative shapes without overflow, data_offsets
/// inside the data section, size == numel * itemsize, no overlapping tensors.
/// Throws CheckpointError "<file_label>: <problem> (tensor '<key>')" on the first problem.
/// Never reads outside `bytes[0, size)`.
Header parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& file_label);

}  // namespace libreyolo::models::core
