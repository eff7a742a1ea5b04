// Tensors that depend only on a model's weights and the input's geometry (position embeddings
// for the patch grid, for instance), kept per key so that every forward after the first at a
// geometry skips the work. The weights never change after loading.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace libreyolo::models {

class ConstantCache {
 public:
  /// The most keys kept (input geometries of one model: the fixed size of a CUDA-graph model, or
  /// a few sizes of a dynamic one); a further key is computed on every call and not kept.
  static constexpr std::size_t kMaxEntries = 8;

  /// The tensor for `key` (e.g. {h, w, dtype}) on `device`: the kept one when there is one, else
  /// make()'s result (expected on `device`), kept for the next calls. Nothing made inside a
  /// CUDA-graph capture is kept (its work is only recorded there, not run), and a kept tensor is
  /// complete before another thread can read it (its stream is synchronised once, when it is kept).
  /// Thread-safe; `make` runs under the cache's lock. Exceptions from make() propagate and keep
  /// nothing.
  at::Tensor get(const std::vector<int64_t>& key, const at::Device& device,
                 const std::function<at::Tensor()>& make) const;

 private:
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<std::vector<int64_t>, at::Tensor>> entries_;
};

}  // namespace libreyolo::models
