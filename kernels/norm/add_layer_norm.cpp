#include "kernels/norm/add_layer_norm.h"

#include <c10/util/Exception.h>

namespace libreyolo::kernels {

at::Tensor add_scaled(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& scale) {
  if (!delta.defined()) return x;
  return x + (scale.defined() ? delta * scale : delta);
}

SumAndNorm add_layer_norm_portable(const at::Tensor& x, const at::Tensor& delta,
                                   const at::Tensor& scale, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps) {
  at::Tensor sum = add_scaled(x, delta, scale);
  auto norm = at::layer_norm(sum, {x.size(-1)}, weight, bias, eps);
  return {std::move(sum), std::move(norm)};
}

SumAndNorm add_layer_norm(const AddLayerNormHandle& handle, const at::Tensor& x,
                          const at::Tensor& delta, const at::Tensor& scale,
                          const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, "add_layer_norm: x must be (..., D), got ",
              x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
  const int64_t d = x.size(-1);
  TORCH_CHECK(!delta.defined() || delta.sizes() == x.sizes(), "add_layer_norm: delta ",
              delta.defined() ? c10::str(delta.sizes()) : std::string(), " must have x's shape ",
              x.sizes());
  auto check_vector = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == d), "add_layer_norm: ", name,
                " must be (", d, "), got ", t.defined() ? c10::str(t.sizes()) : std::string());
  };
  check_vector(scale, "scale");
  check_vector(weight, "weight");
  check_vector(bias, "bias");
  TORCH_CHECK(!scale.defined() || delta.defined(), "add_layer_norm: scale without delta");
  if (!handle.empty()) {
    if (auto out = handle(x, delta, scale, weight, bias, eps)) return std::move(*out);
  }
  return add_layer_norm_portable(x, delta, scale, weight, bias, eps);
}

}  // namespace libreyolo::kernels
