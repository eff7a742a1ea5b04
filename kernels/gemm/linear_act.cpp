#include "kernels/gemm/linear_act.h"

#include <c10/util/Exception.h>

#include "kernels/conv/conv2d_bias_act.h"

namespace libreyolo::kernels {

at::Tensor linear_act_portable(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, Activation act) {
  return apply_activation(act, at::linear(x, weight, bias));
}

at::Tensor linear_act(const LinearActHandle& handle, const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, Activation act) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, "linear_act: x must be (..., K), got ",
              x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
  TORCH_CHECK(weight.defined() && weight.dim() == 2 && weight.size(1) == x.size(-1),
              "linear_act: weight must be (N, ", x.size(-1), "), got ",
              weight.defined() ? c10::str(weight.sizes()) : std::string("an undefined tensor"));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "linear_act: bias must be (", weight.size(0), "), got ",
              bias.defined() ? c10::str(bias.sizes()) : std::string());
  if (!handle.empty()) {
    if (auto out = handle(x, weight, bias, act)) return std::move(*out);
  }
  return linear_act_portable(x, weight, bias, act);
}

}  // namespace libreyolo::kernels
