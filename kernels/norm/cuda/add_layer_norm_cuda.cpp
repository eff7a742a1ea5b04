// The `cuda` implementation of add_layer_norm: kernels/norm/cuda/add_layer_norm_cuda.h for
// contiguous rows of up to 1,024 elements in whole 16-byte vectors (every ViT / DETR width);
// anything else declines to the portable ATen ops.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/vector_pack.cuh"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/norm/cuda/add_layer_norm_cuda.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<SumAndNorm> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& delta,
                                        const at::Tensor& scale, const at::Tensor& weight,
                                        const at::Tensor& bias, double eps,
                                        const at::Tensor& norm_rows, const at::Tensor& delta_rows) {
  if (!x.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || (delta.defined() && delta.requires_grad()) || weight.requires_grad()))
    return Decline{"cuda: autograd (no backward)"};
  if (!weight.defined() || !bias.defined()) return Decline{"cuda: no affine weight and bias"};
  if (!cuda::add_layer_norm_supports(x.size(-1), dtype))
    return Decline{"cuda: width over 1024 or not a whole number of 16-byte vectors"};
  auto usable = [&](const at::Tensor& t) {
    return !t.defined() || (t.is_cuda() && t.device() == x.device() && t.scalar_type() == dtype &&
                            t.is_contiguous() && cuda::aligned16(t.data_ptr()));
  };
  if (!usable(x) || !usable(delta) || !usable(scale) || !usable(weight) || !usable(bias))
    return Decline{"cuda: a tensor not contiguous, 16-byte aligned, or of x's dtype and device"};
  // The entry point checked the indices' dtype, shape and device.
  if ((norm_rows.defined() && !norm_rows.is_contiguous()) ||
      (delta_rows.defined() && !delta_rows.is_contiguous()))
    return Decline{"cuda: a row index not contiguous"};
  if (norm_rows.defined() || delta_rows.defined()) {
    // The kernel splits row numbers into (image, row) with 32-bit divisions.
    const int64_t x_rows = x.numel() / x.size(-1), n = x.dim() >= 2 ? x.size(-2) : x_rows;
    const int64_t out_rows = norm_rows.defined() && n > 0 ? x_rows / n * norm_rows.size(0) : x_rows;
    if (std::max(x_rows, out_rows) > UINT32_MAX)
      return Decline{"cuda: row orders over 2^32 - 1 rows"};
  }
  return cuda::add_layer_norm(x, delta, scale, weight, bias, eps, norm_rows, delta_rows);
}

}  // namespace

void register_add_layer_norm_cuda(Registry& registry) {
  registry.register_impl(
      kAddLayerNorm, "cuda", &add_layer_norm_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels
