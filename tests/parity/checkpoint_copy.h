// Edited copies of a fixture checkpoint folder for the strict-loading tests of the parity suite
// (test-only): config.json copied, model.safetensors rewritten tensor by tensor.
#pragma once

#include <ATen/ATen.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "models/core/safetensors.h"

namespace libreyolo::test {

/// Copies `src`/config.json and `src`/model.safetensors to a new folder under /tmp, each tensor
/// passed through `edit` (nullopt drops it; its dtype name is kept), plus the float32 tensors of
/// `extra`; returns the folder. Throws std::runtime_error when the folder cannot be made.
inline std::string corrupted_copy(
    const std::string& src,
    const std::function<std::optional<at::Tensor>(const std::string&, const at::Tensor&)>& edit,
    const std::map<std::string, at::Tensor>& extra = {}) {
  namespace core = libreyolo::models::core;
  char tmpl[] = "/tmp/libreyolo_ckpt_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string tmp = tmpl;
  {
    std::ifstream in(src + "/config.json", std::ios::binary);
    std::ofstream out(tmp + "/config.json", std::ios::binary);
    out << in.rdbuf();
  }
  const auto file = core::SafetensorsFile::open(src + "/model.safetensors");
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto put = [&](const std::string& key, const at::Tensor& t, const std::string& dtype) {
    const auto c = t.contiguous();
    const size_t bytes = c.numel() * c.element_size();
    header[key] = {{"dtype", dtype},
                   {"shape", c.sizes().vec()},
                   {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(c.data_ptr()), bytes);
  };
  for (const auto& key : file->keys()) {
    const auto t = edit(key, file->view(key));
    if (t) put(key, *t, core::dtype_name(file->info(key).dtype));
  }
  for (const auto& [key, t] : extra) put(key, t.to(at::kFloat), "F32");
  const std::string h = header.dump();
  std::ofstream out(tmp + "/model.safetensors", std::ios::binary);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << h << data;
  return tmp;
}

/// Removes a folder made by corrupted_copy.
inline void remove_copy(const std::string& tmp) {
  std::remove((tmp + "/config.json").c_str());
  std::remove((tmp + "/model.safetensors").c_str());
  rmdir(tmp.c_str());
}

}  // namespace libreyolo::test
