// The in-tree CUDA kernels of `ms_deform_attn` (forward and backward), without the slot logic.
//
// Contract of kernels/attention/ms_deform_attn.h; every tensor on one CUDA device, contiguous:
//   value (B, S, H, C) float32/float16/bfloat16; sampling_locations (B, Q, H, L, P, 2) and
//   attention_weights (B, Q, H, L, P) of the value dtype or float32 (both the same);
//   spatial_shapes (L, 2) int64 (H_l, W_l); level_start_index (L) int64; L <= kMaxLevels.
// The launchers neither validate the spatial metadata on the host nor synchronise: they run on the
// current stream and allocate through the caching allocator, so they can be captured in a CUDA
// graph. Corner reads outside [0, S) are skipped in the kernel, so malformed metadata cannot read
// out of bounds. Indexing is 64-bit. Accumulation is float32.
// Algorithm: Deformable DETR (Zhu et al., ICLR 2021) models/ops/src/cuda/ms_deform_im2col_cuda.cuh,
// re-designed as one warp per (b, h, q): lanes cover the C channels with 16-byte loads and the
// rest of the warp splits the L*P sampling points; see docs/bench/kernels.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace libreyolo::kernels::cuda {

/// Most levels the kernels accept (spatial metadata is staged in shared memory).
inline constexpr int64_t kMaxLevels = 16;

/// Forward: returns (B, Q, H * C) in the value dtype. Deterministic (fixed reduction order).
/// Throws c10::Error on a launch failure.
at::Tensor ms_deform_attn_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                  const at::Tensor& level_start_index,
                                  const at::Tensor& sampling_locations,
                                  const at::Tensor& attention_weights);

/// Benchmarking and testing knob of the forward: 0 (default) = msda_forward_v2 (grid over
/// (query blocks, heads, batch), 32-bit pixel indices, wide lanes); 1, 2 or 4 = the first kernel
/// (one warp per (b, h, q) from a flat index) loading that many points per lane group at once.
/// Both give identical results up to float32 summation order. Process-wide, not thread-safe.
void set_forward_variant(int variant);

/// Backward: grad_output (B, Q, H * C) of the value dtype. Returns (grad_value (value dtype),
/// grad_sampling_locations, grad_attention_weights (location dtype)). grad_value is accumulated
/// with float32 atomics (in a float32 buffer for 16-bit values), so its last bits depend on the
/// order of the atomics; grad_sampling_locations and grad_attention_weights are deterministic.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward(
    const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
    const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    const at::Tensor& grad_output);

}  // namespace libreyolo::kernels::cuda
