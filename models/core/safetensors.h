// Memory-mapped safetensors checkpoints as ATen tensors.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "models/core/safetensors_header.h"

namespace libreyolo::models::core {

/// ATen scalar type of a safetensors dtype (U16/U32/U64 map to their signed counterparts'
/// unsigned ATen types; F8_E4M3 -> Float8_e4m3fn, F8_E5M2 -> Float8_e5m2).
at::ScalarType to_scalar_type(DType dtype);

/// An open, validated safetensors file, memory-mapped read-only. Cheap to share: tensors
/// returned by view() keep the mapping alive, so they may outlive this object.
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Throws CheckpointError naming the path (cannot open, not a
  /// regular file, or any header problem of parse_safetensors_header).
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  bool contains(const std::string& key) const { return header_.find(key) != nullptr; }
  /// Keys, sorted.
  std::vector<std::string> keys() const;
  /// Header entry of `key`; throws CheckpointError "<path>: missing tensor (tensor '<key>')".
  const TensorInfo& info(const std::string& key) const;

  /// Zero-copy CPU view of `key` in its stored dtype (at::from_blob over the mapping; the
  /// deleter holds the mapping). Read-only by contract: never write into it. On a big-endian
  /// host it is a byte-swapped copy instead. Throws CheckpointError for an unknown key.
  at::Tensor view(const std::string& key) const;

  /// `key` converted to `dtype` on `device` (always a new tensor, never aliasing the mapping).
  at::Tensor get(const std::string& key, at::ScalarType dtype, const at::Device& device) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  Header header_;
};

}  // namespace libreyolo::models::core
