// Minimal safetensors writer for libreyolo-predict's raw dumps (format: 8-byte little-endian
// header length, JSON header {name: {dtype, shape, data_offsets}}, raw little-endian data;
// https://github.com/huggingface/safetensors).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

namespace libreyolo::tools {

/// Writes CPU-contiguous copies of `tensors` (float32/16, bfloat16, int64/32, uint8, bool) to
/// `path`, keys sorted. Throws std::runtime_error naming the path or the unsupported dtype.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace libreyolo::tools
