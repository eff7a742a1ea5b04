// Edited copies of a fixture checkpoint folder for the strict-loading tests of the parity suite
// (test-only): config.json copied, model.safetensors rewritten by the tests' writer
// (tests/support/safetensors_writer.h).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "models/core/safetensors.h"
#include "models/model.h"
#include "tests/support/safetensors_writer.h"

namespace libreyolo::test {

/// Copies `src`/config.json to a new folder under /tmp and writes its model.safetensors: the
/// tensors of `src`/model.safetensors (copies, in the file's order) after `edit`. Returns the
/// folder (remove_copy removes it). POSIX, not std::filesystem: LibTorch's libtorch.so exports
/// clashing std::filesystem symbols. Throws std::runtime_error when the folder cannot be made.
inline std::string edited_copy(const std::string& src,
                               const std::function<void(NamedTensors&)>& edit) {
  char tmpl[] = "/tmp/libreyolo_ckpt_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string tmp = tmpl;
  {
    std::ifstream in(src + "/config.json", std::ios::binary);
    std::ofstream out(tmp + "/config.json", std::ios::binary);
    out << in.rdbuf();
  }
  const auto file = models::core::SafetensorsFile::open(src + "/model.safetensors");
  NamedTensors tensors;
  for (const auto& key : file->keys()) tensors.emplace_back(key, file->view(key).clone());
  edit(tensors);
  write_safetensors(tmp + "/model.safetensors", tensors);
  return tmp;
}

/// edited_copy with each tensor passed through `edit` (nullopt drops it), plus the tensors of
/// `extra` as float32.
inline std::string corrupted_copy(
    const std::string& src,
    const std::function<std::optional<at::Tensor>(const std::string&, const at::Tensor&)>& edit,
    const std::map<std::string, at::Tensor>& extra = {}) {
  return edited_copy(src, [&](NamedTensors& tensors) {
    NamedTensors kept;
    for (const auto& [key, t] : tensors) {
      auto edited = edit(key, t);
      if (edited) kept.emplace_back(key, std::move(*edited));
    }
    for (const auto& [key, t] : extra) kept.emplace_back(key, t.to(at::kFloat));
    tensors = std::move(kept);
  });
}

/// Removes a folder made by edited_copy or corrupted_copy.
inline void remove_copy(const std::string& tmp) {
  std::remove((tmp + "/config.json").c_str());
  std::remove((tmp + "/model.safetensors").c_str());
  rmdir(tmp.c_str());
}

/// The message of the std::runtime_error that load_model(dir) throws; "(loaded)" when it loads.
inline std::string load_error(const std::string& dir) {
  try {
    models::load_model(dir);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

/// Loading `src` without its tensor `file_key` fails naming `module_key` as the one missing key.
inline void expect_missing_key_named(const std::string& src, const std::string& file_key,
                                     const std::string& module_key) {
  const auto dir = corrupted_copy(src, [&](const std::string& k, const at::Tensor& t) {
    return k == file_key ? std::nullopt : std::optional<at::Tensor>(t);
  });
  EXPECT_EQ(load_error(dir), dir +
                                 "/model.safetensors: checkpoint does not match the model: "
                                 "missing keys (1): " +
                                 module_key);
  remove_copy(dir);
}

/// Loading `src` with an extra float32 tensor `key` (zeros of `shape`) fails naming it as the one
/// unexpected key.
inline void expect_unexpected_key_named(const std::string& src, const std::string& key,
                                        at::IntArrayRef shape) {
  const auto dir = corrupted_copy(
      src, [](const std::string&, const at::Tensor& t) { return std::optional<at::Tensor>(t); },
      {{key, at::zeros(shape)}});
  EXPECT_EQ(load_error(dir), dir +
                                 "/model.safetensors: checkpoint does not match the model: "
                                 "unexpected keys (1): " +
                                 key);
  remove_copy(dir);
}

}  // namespace libreyolo::test
