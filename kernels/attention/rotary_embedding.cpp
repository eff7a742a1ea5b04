#include "kernels/attention/rotary_embedding.h"

#include <ATen/core/grad_mode.h>

namespace libreyolo::kernels {

at::Tensor rotary_embedding_portable(const at::Tensor& x, const at::Tensor& cos,
                                     const at::Tensor& signed_sin, int64_t prefix) {
  const int64_t L = x.size(-2), half = x.size(-1) / 2, N = L - prefix;
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || cos.requires_grad() || signed_sin.requires_grad())) {
    // Autograd: the same ops without out= arguments (which autograd refuses), equal values.
    const at::Tensor p = x.narrow(-2, prefix, N);
    const at::Tensor r = at::cat({p.narrow(-1, half, half) * signed_sin.narrow(-1, 0, half),
                                  p.narrow(-1, 0, half) * signed_sin.narrow(-1, half, half)},
                                 -1);
    return at::cat({x.narrow(-2, 0, prefix), p * cos + r}, -2).contiguous();
  }
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (prefix > 0) out.narrow(-2, 0, prefix).copy_(x.narrow(-2, 0, prefix));
  const at::Tensor p = x.narrow(-2, prefix, N);
  at::Tensor o = out.narrow(-2, prefix, N);
  at::mul_out(o, p, cos);  // p * cos, rounded
  // rotate_half(p) * sin = [-p2 * sin1, p1 * sin2] = [p2 * -sin1, p1 * sin2], rounded.
  at::Tensor r = at::empty(p.sizes(), out.options());
  at::Tensor r1 = r.narrow(-1, 0, half), r2 = r.narrow(-1, half, half);
  at::mul_out(r1, p.narrow(-1, half, half), signed_sin.narrow(-1, 0, half));
  at::mul_out(r2, p.narrow(-1, 0, half), signed_sin.narrow(-1, half, half));
  o.add_(r);  // the sum, rounded
  return out;
}

at::Tensor rotary_embedding(const RotaryEmbeddingHandle& handle, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& signed_sin) {
  TORCH_CHECK(x.defined() && cos.defined() && signed_sin.defined(),
              "rotary_embedding: x, cos and signed_sin must be defined");
  TORCH_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, "rotary_embedding: x ", x.sizes(),
              " must be (..., L, D) with D even");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == x.size(-1) && cos.size(0) <= x.size(-2),
              "rotary_embedding: cos ", cos.sizes(), " must be (N, D) with N <= L for x ",
              x.sizes());
  TORCH_CHECK(signed_sin.sizes() == cos.sizes(), "rotary_embedding: signed_sin ",
              signed_sin.sizes(), " and cos ", cos.sizes(), " must have one shape");
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
               dtype == at::kBFloat16) &&
                  cos.scalar_type() == dtype && signed_sin.scalar_type() == dtype,
              "rotary_embedding: x (", x.scalar_type(), "), cos (", cos.scalar_type(),
              ") and signed_sin (", signed_sin.scalar_type(),
              ") must share one dtype of float32, float64, float16 or bfloat16");
  TORCH_CHECK(cos.device() == x.device() && signed_sin.device() == x.device(),
              "rotary_embedding: x on ", x.device(), ", cos on ", cos.device(), ", signed_sin on ",
              signed_sin.device(), ": all three must be on one device");
  const int64_t prefix = x.size(-2) - cos.size(0);
  if (auto out = handle(x, cos, signed_sin, prefix)) return *out;
  return rotary_embedding_portable(x, cos, signed_sin, prefix);
}

}  // namespace libreyolo::kernels
