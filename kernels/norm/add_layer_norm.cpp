#include "kernels/norm/add_layer_norm.h"

#include <c10/util/Exception.h>

namespace libreyolo::kernels {

at::Tensor add_scaled(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale) {
  if (!delta.defined()) return x;
  return x + (scale.defined() ? delta * scale : delta);
}

SumAndNorm add_layer_norm_portable(const at::Tensor& x, const at::Tensor& delta,
                                   const at::Tensor& scale, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps, const at::Tensor& norm_rows,
                                   const at::Tensor& delta_rows) {
  const int64_t d = x.size(-1);
  const at::Tensor aligned =
      delta_rows.defined() ? delta.index_select(delta.dim() - 2, delta_rows) : delta;
  at::Tensor sum = add_scaled(x, aligned, scale);
  auto norm = at::layer_norm(sum, {d}, weight, bias, eps);
  if (norm_rows.defined()) {
    // Padding positions: zeros, as constant_pad_nd writes them after the modules' LayerNorm.
    norm = norm.index_select(x.dim() - 2, norm_rows.clamp_min(0));
    norm.masked_fill_((norm_rows < 0).unsqueeze(1), 0);
  }
  return {std::move(sum), std::move(norm)};
}

SumAndNorm add_layer_norm(const AddLayerNormHandle& handle, const at::Tensor& x,
                          const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps,
                          const at::Tensor& norm_rows, const at::Tensor& delta_rows) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, "add_layer_norm: x must be (..., D), got ",
              x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
  const int64_t d = x.size(-1);
  TORCH_CHECK(x.dim() >= 2 || (!norm_rows.defined() && !delta_rows.defined()),
              "add_layer_norm: row orders need x (..., N, D), got ", x.sizes());
  if (delta_rows.defined()) {
    TORCH_CHECK(delta.defined() && delta.dim() == x.dim() && delta.size(-1) == d &&
                    delta.sizes().slice(0, x.dim() - 2) == x.sizes().slice(0, x.dim() - 2),
                "add_layer_norm: delta_rows needs delta (..., M, ", d, ") with x's leading dims ",
                x.sizes(), ", got ", delta.defined() ? c10::str(delta.sizes()) : "none");
  } else {
    TORCH_CHECK(!delta.defined() || delta.sizes() == x.sizes(), "add_layer_norm: delta ",
                delta.defined() ? c10::str(delta.sizes()) : std::string(), " must have x's shape ",
                x.sizes());
  }
  auto check_index = [&](const at::Tensor& t, const char* name, int64_t n) {
    TORCH_CHECK(
        !t.defined() || (t.dim() == 1 && t.scalar_type() == at::kLong && t.device() == x.device() &&
                         (n < 0 || t.size(0) == n)),
        "add_layer_norm: ", name, " must be int64 (", n < 0 ? "R" : c10::str(n),
        ") on x's device, got ",
        t.defined() ? c10::str(t.scalar_type(), t.sizes(), " on ", t.device()) : std::string());
  };
  check_index(norm_rows, "norm_rows", -1);
  check_index(delta_rows, "delta_rows", x.dim() >= 2 ? x.size(-2) : -1);
  auto check_vector = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == d), "add_layer_norm: ", name,
                " must be (", d, "), got ", t.defined() ? c10::str(t.sizes()) : std::string());
  };
  check_vector(scale, "scale");
  check_vector(weight, "weight");
  check_vector(bias, "bias");
  TORCH_CHECK(!scale.defined() || delta.defined(), "add_layer_norm: scale without delta");
  if (!handle.empty()) {
    if (auto out = handle(x, delta, scale, weight, bias, eps, norm_rows, delta_rows))
      return std::move(*out);
  }
  return add_layer_norm_portable(x, delta, scale, weight, bias, eps, norm_rows, delta_rows);
}

}  // namespace libreyolo::kernels
