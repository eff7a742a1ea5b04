#include "tools/predict/safetensors_write.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

namespace libreyolo::tools {
namespace {

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kDouble:
      return "F64";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      throw std::runtime_error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> data;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    at::Tensor c = t.detach().cpu().contiguous();
    const size_t bytes = c.numel() * c.element_size();
    header[name] = {{"dtype", dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // align the data like the reference writer
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open for writing");
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& c : data)
    f.write(static_cast<const char*>(c.data_ptr()),
            static_cast<std::streamsize>(c.numel() * c.element_size()));
  if (!f) throw std::runtime_error(path + ": write error");
}

}  // namespace libreyolo::tools
