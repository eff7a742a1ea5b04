// The `cuda` implementation of the attention slot: kernels/attention/cuda/flash_attention_cuda.h
// for unbiased float16 / bfloat16 calls with 16- or 32-dimensional heads (LW-DETR's ViT, the
// RT-DETR lineage's AIFI and decoder self-attention). Everything else declines to mem_efficient /
// sdpa / reference (kernels/attention/dot_product_attention.h).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda/flash_attention_cuda.h"
#include "kernels/attention/dot_product_attention.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> flash_attention_cuda(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias,
                                         const AttentionCall& c) {
  if (!q.is_cuda()) return Decline{"cuda: not a CUDA tensor"};
  if (bias.defined()) return Decline{"cuda: a bias or mask (unbiased calls only)"};
  const auto dtype = q.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16)
    return Decline{"cuda: dtype (float16, bfloat16 only)"};
  if (k.scalar_type() != dtype || v.scalar_type() != dtype || k.device() != q.device() ||
      v.device() != q.device())
    return Decline{"cuda: q, k, v of different dtypes or devices"};
  const int64_t d = q.size(3);
  if (!cuda::flash_attention_supports_head_dim(d)) return Decline{"cuda: head_dim (16 or 32 only)"};
  if (k.size(3) != d || v.size(3) != d || k.size(0) != q.size(0) || v.size(0) != q.size(0) ||
      k.size(1) != q.size(1) || v.size(1) != q.size(1) || v.size(2) != k.size(2))
    return Decline{"cuda: q, k, v shapes differ"};
  if (k.size(2) == 0) return Decline{"cuda: no keys"};
  // The row max is taken before scaling: a positive finite scale keeps it the max.
  if (!(c.scale > 0.0) || !std::isfinite(c.scale)) return Decline{"cuda: scale not positive"};
  const int64_t q_blocks = (q.size(2) + 63) / 64;
  if (q.size(2) > INT32_MAX || k.size(2) > INT32_MAX ||
      q.size(0) * q.size(1) * q_blocks > INT32_MAX)
    return Decline{"cuda: over 2^31 - 1 tokens or blocks"};
  if (!cuda::flash_attention_available(q.get_device()))
    return Decline{"cuda: no sm_80+ code for this device in the build"};
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return Decline{"cuda: autograd (no backward)"};
  if (!cuda::flash_attention_rows_aligned(q) || !cuda::flash_attention_rows_aligned(k) ||
      !cuda::flash_attention_rows_aligned(v))
    return Decline{"cuda: rows not contiguous, 16-byte aligned, strides multiples of 8"};
  return cuda::flash_attention(q, k, v, c.scale);
}

}  // namespace

void register_flash_attention_cuda(Registry& registry) {
  registry.register_impl(
      kAttention, "cuda", &flash_attention_cuda,
      // cp.async and bf16 mma.sync need sm_80 (Ampere) or newer, and the build's code for it.
      [] { return at::cuda::is_available() && cuda::flash_attention_available(0); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels
