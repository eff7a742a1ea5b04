// The `rotary_embedding` slot: rotary position embedding (RoPE, Su et al. 2021, "RoFormer",
// arXiv:2104.09864) on the patch tokens of queries or keys, as DINOv3 applies it
// (modeling_dinov3_vit.py apply_rotary_pos_emb):
//   out[:prefix] = x[:prefix]                         (CLS and register tokens kept)
//   out[prefix:] = p * cos + rotate_half(p) * sin,    p = x[prefix:], rotate_half(p) = cat(-p2, p1)
// Upstream that is a split, six elementwise ops and a concatenation per tensor; the portable path
// takes cos and sin with sin's first half negated (signed_sin: rotate_half(p) * sin =
// [p2 * -sin1, p1 * sin2], the negation exact), so three products, one sum and one prefix copy.
// At DEIMv2-S batch 32 those strided passes over q and k took about 1.8 ms of a 15.8 ms forward
// on an H100 (docs/BENCHMARKS.md).
//
// Implementations: the portable path (ATen ops) and `cuda`
// (kernels/attention/cuda/rotary_embedding_cuda.h: one pass, reading x through its strides).
// Both give upstream's values bit for bit on their device: each product and the sum rounded to
// the dtype once, as ATen's ops round them (16-bit ops computed in float32).
#pragma once

#include <ATen/ATen.h>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration: (x (..., L, D), cos (N, D), signed_sin (N, D), prefix = L - N) -> a
/// contiguous tensor of x's shape and dtype. The entry point below has validated them.
inline constexpr SlotDef<at::Tensor(const at::Tensor& x, const at::Tensor& cos,
                                    const at::Tensor& signed_sin, int64_t prefix)>
    kRotaryEmbedding{"rotary_embedding"};
using RotaryEmbeddingHandle = Handle<decltype(kRotaryEmbedding)::Signature>;

/// The model-facing entry point. x (..., L, D) of any strides (e.g. q and k viewed from one
/// packed qkv GEMM as (2, B, H, L, D)), D even; cos and signed_sin (N, D) with N <= L, in x's
/// floating dtype and on its device -> contiguous (..., L, D): the first prefix = L - N rows
/// copied, the other rows p * cos + rotate_half(p) * sin with sin = signed_sin with its first
/// half negated back. Calls `handle`, and the portable path when it is empty or every candidate
/// declined. Throws c10::Error naming the argument on a shape, dtype (float32, float64, float16,
/// bfloat16 only) or device mismatch.
at::Tensor rotary_embedding(const RotaryEmbeddingHandle& handle, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& signed_sin);

/// The portable path alone (validated arguments; prefix = L - N): ATen ops in upstream's
/// rounding order, on any device; under autograd (an argument requiring grad) the same ops in
/// functional form, differentiable, with equal values.
at::Tensor rotary_embedding_portable(const at::Tensor& x, const at::Tensor& cos,
                                     const at::Tensor& signed_sin, int64_t prefix);

}  // namespace libreyolo::kernels
