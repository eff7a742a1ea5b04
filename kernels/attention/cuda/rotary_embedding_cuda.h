// The CUDA kernel of the `cuda` rotary_embedding (kernels/attention/rotary_embedding.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace libreyolo::kernels::cuda {

/// The most leading dimensions of x (all but the last) the kernel walks through strides.
inline constexpr int kRotaryMaxLeadingDims = 6;

/// RoPE in one pass: x (..., L, D) on a CUDA device, any strides with x.stride(-1) == 1, at most
/// kRotaryMaxLeadingDims leading dimensions, D even; cos and signed_sin (N, D) contiguous, N <= L,
/// prefix = L - N; float32 / float16 / bfloat16, one dtype and device. Returns a contiguous
/// (..., L, D) tensor: the first prefix rows of each (..., L) copied, the others
/// p * cos + [p2 * signed_sin1, p1 * signed_sin2], each product and the sum computed in float32
/// and rounded to the dtype once, as ATen's mul and add round them (equal to the portable path).
/// 16-byte loads where D / 2 and every address allow them. Runs on the current stream. Throws
/// c10::Error for any other input (the slot declines first).
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& signed_sin, int64_t prefix);

}  // namespace libreyolo::kernels::cuda
