// The `cuda` implementation of max_pool2d: kernels/pool/cuda/max_pool2d_cuda.h for
// channels_last inputs (the layout the channels_last layout gives a CUDA model's backbone);
// NCHW, autograd and other dtypes decline to the portable at::max_pool2d.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/pool/cuda/max_pool2d_cuda.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/pool/max_pool2d_problem.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> max_pool2d_cuda(const at::Tensor& input, const PoolGeometry& g) {
  if (!input.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() && input.requires_grad())
    return Decline{"cuda: autograd (no backward)"};
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast))
    return Decline{"cuda: not channels_last (NCHW runs at::max_pool2d)"};
  // The slot entry's checks again (a direct call of the handle), before the output size that
  // divides by the stride.
  if (max_pool2d_problem(input, g)) return Decline{"cuda: geometry"};
  // A throw would disable the implementation for the process: refuse what the kernel refuses.
  const int64_t ow = max_pool2d_output_size(input.size(3), g.kernel_w, g.pad_w, g.stride_w,
                                            g.dilation_w, g.ceil_mode);
  if (ow * input.size(1) > cuda::kMaxRowItems)
    return Decline{"cuda: an output row beyond the kernel's 32-bit index"};
  return cuda::max_pool2d_nhwc(input, g);
}

}  // namespace

void register_max_pool2d_cuda(Registry& registry) {
  registry.register_impl(
      kMaxPool2d, "cuda", &max_pool2d_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels
