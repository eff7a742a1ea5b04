// The CUDA kernel of the `cuda` image_preprocess (kernels/image/image_preprocess.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/image/image_preprocess.h"

namespace libreyolo::kernels::cuda {

/// Images per kernel launch: the per-image parameters travel in the launch's parameter block
/// (32 bytes each, under its 4 KiB), so a larger batch takes ceil(B / 96) launches.
inline constexpr int kMaxImagesPerLaunch = 96;

/// Writes `out` (B, 3, H, W) float32 / float16 / bfloat16 on a CUDA device, contiguous or
/// channels_last, from `images` (B tensors (3, h, w) uint8, contiguous, on out's device) as
/// kernels/image/image_preprocess.h describes: image i resized to spec.sizes[i] at the top-left
/// of row i, zeros elsewhere. One thread per output pixel (all three channels), blocks of 32 x 8
/// pixels of one image, the resize weights of the block's columns and rows in shared memory (as
/// ATen's kernel keeps them). Runs on the current stream of out's device; reads nothing back.
/// Throws c10::Error when image_preprocess_decline_reason would decline, or for sizes that do
/// not fit `out` (the slot's predicate and entry point check first).
void image_preprocess(const std::vector<at::Tensor>& images, const ImagePreprocessSpec& spec,
                      const at::Tensor& out);

}  // namespace libreyolo::kernels::cuda
