// The in-tree CUDA attention kernel for small heads (head_dim 16 or 32), without the slot logic.
//
// Why: LW-DETR's ViT runs 12 heads of 16 dimensions over 1,600 tokens. SDPA hands such calls
// to cuDNN's flash kernel, which pads the head to 64 (its tile is 64x128x64): at batch 32 that
// kernel was 3.3 of the forward's 8.3 ms on the H200 (docs/BENCHMARKS.md, sixth run). With 16
// dimensions a score costs 32 multiply-adds in the tensor cores and one exponential, so the
// kernel is bound by the exponentials (the SFU), not by the GEMMs: what matters is issuing
// nothing for the padding.
//
// Algorithm: FlashAttention-2 (Dao, 2023, arXiv:2307.08691, Algorithm 1): one warp per 16 query
// rows, key/value tiles of 64 rows staged in shared memory with cp.async (double-buffered), the
// scores of a tile in registers (mma.sync m16n8k16, float32 accumulators), the online softmax
// in base 2 (scale * log2 e folded into one FMA), and the probabilities reused from the score
// accumulators as the A operand of P V after rounding to the input dtype (as FlashAttention-2 and
// cuDNN do). Requires sm_80 or newer (cp.async, bf16 mma.sync) and a build for the device.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace libreyolo::kernels::cuda {

/// True when `device` is sm_80 or newer and this build holds the kernel's code for it (the
/// build's CMAKE_CUDA_ARCHITECTURES; sm_90 by default). No error is left behind.
bool flash_attention_available(int device);

/// True for the head dims the kernel is built for (16 and 32). Both beat SDPA's choice (cuDNN)
/// at the models' shapes on an H100, bf16 (tools/bench_attention; docs/BENCHMARKS.md, "The
/// attention slot's small-head kernel"): d = 16 LW-DETR's ViT, 487 against 638 us (1,600 tokens)
/// and 73.5 against 101 us (100-token windows); d = 32 RT-DETR's AIFI 14.1 against 16.3 us and the
/// DETR decoders' self-attention 25.9 against 32.3 us.
bool flash_attention_supports_head_dim(int64_t head_dim);

/// True when `t` (B, H, L, d) has contiguous rows, 16-byte aligned data and every other stride a
/// multiple of 8 elements (the kernel copies rows in 16-byte pieces).
bool flash_attention_rows_aligned(const at::Tensor& t);

/// softmax(q k^T * scale) v without a bias or mask.
/// q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, d): float16 or bfloat16 (all the same), on one
/// CUDA device, last dim contiguous, data 16-byte aligned and every other stride a multiple of
/// 8 elements (views of a packed QKV projection qualify: no copy is made); d in {16, 32};
/// Lk >= 1. Returns (B, H, Lq, d) in q's dtype as a transposed view of a contiguous
/// (B, Lq, H, d) tensor, so that the caller's transpose(1, 2).reshape(B, Lq, H * d) is free.
/// Scores and softmax in float32; the probabilities rounded to the input dtype before P V.
/// Runs on the current stream, allocates through the caching allocator, never synchronises (CUDA
/// graph capture safe). Throws c10::Error on a contract violation or a launch failure.
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale);

}  // namespace libreyolo::kernels::cuda
