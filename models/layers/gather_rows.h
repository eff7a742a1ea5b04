// Selecting rows by index: what every two-stage query selection does with the top-k of its
// encoder scores.
#pragma once

#include <ATen/ATen.h>

namespace libreyolo::models::layers {

/// t (B or 1, S, D) and index (B, K) int64 rows in [0, S) -> (B, K, D) in t's dtype:
/// out[b, k] = t[b, index[b, k]] (at::gather along dim 1; a batch-1 t, such as anchors shared by
/// the batch, serves every b). Throws c10::Error for an index out of range.
inline at::Tensor gather_rows(const at::Tensor& t, const at::Tensor& index) {
  const at::Tensor source =
      t.size(0) == index.size(0) ? t : t.expand({index.size(0), t.size(1), t.size(2)});
  return source.gather(1, index.unsqueeze(-1).expand({-1, -1, t.size(2)}));
}

}  // namespace libreyolo::models::layers
