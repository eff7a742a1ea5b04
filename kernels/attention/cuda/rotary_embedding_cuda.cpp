// The `cuda` implementation of rotary_embedding: kernels/attention/cuda/rotary_embedding_cuda.h for
// float32 / float16 / bfloat16 without autograd, x's rows contiguous; anything else declines to the
// portable path (ATen's ops on CUDA).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/attention/cuda/rotary_embedding_cuda.h"
#include "kernels/attention/rotary_embedding.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> rotary_embedding_cuda(const at::Tensor& x, const at::Tensor& cos,
                                          const at::Tensor& signed_sin, int64_t prefix) {
  if (!x.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float32, float16, bfloat16 only)"};
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || cos.requires_grad() || signed_sin.requires_grad()))
    return Decline{"cuda: autograd (no backward)"};
  if (x.stride(-1) != 1) return Decline{"cuda: x's last dimension not contiguous"};
  if (x.size(-1) >= (int64_t{1} << 31)) return Decline{"cuda: 2^31 features or more"};
  if (x.dim() - 1 > cuda::kRotaryMaxLeadingDims) return Decline{"cuda: more than 6 leading dims"};
  if (!cos.is_contiguous() || !signed_sin.is_contiguous())
    return Decline{"cuda: cos or signed_sin not contiguous"};
  return cuda::rotary_embedding(x, cos, signed_sin, prefix);
}

}  // namespace

void register_rotary_embedding_cuda(Registry& registry) {
  registry.register_impl(
      kRotaryEmbedding, "cuda", &rotary_embedding_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels
