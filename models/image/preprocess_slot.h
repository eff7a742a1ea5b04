// The `image_preprocess` kernel slot seen from models/ (kernels/image/image_preprocess.h): the
// settings of an image processor as the slot's spec, and the entry points callers preprocess
// decoded images through, so that the `cuda` kernel takes what it does exactly as the processor
// and everything else takes the portable path: ImageProcessor::preprocess (its ATen ops), the
// numbers the slot is checked against.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "kernels/image/image_preprocess.h"
#include "models/image/processor.h"

namespace libreyolo::image {

/// The slot's spec of `processor` for `images` (each (3, h, w)): sizes[i] =
/// processor.output_size(h, w); the value step from the config (normalize with fused_mean_std,
/// else rescale with float32(rescale_factor), else raw; RF-DETR's rescale before the resize:
/// rescale_factor, then normalize with image_mean / image_std, else raw); the flags of the
/// steps the `cuda` implementation declines (center crop, OWLv2's pipeline, resample,
/// antialias, native uint8). Throws as output_size does (c10::ValueError for a YOLOS
/// image whose side floors to 0).
kernels::ImagePreprocessSpec preprocess_spec(const ImageProcessor& processor,
                                             const std::vector<at::Tensor>& images);

/// Writes the processed batch of `images` ((3, h, w) uint8, on one device) into `out`
/// (B, 3, H, W) of any floating dtype and memory format on their device, with H and W at least
/// every output_size: image i at the top-left of row i, zeros elsewhere (do_pad's padding).
/// Through `handle` (bound with kernels::kImagePreprocess for the caller's device); when it is
/// empty or declines, the portable path: processor.preprocess(images).pixel_values copied into
/// `out` (the dtype conversion rounding to nearest even, as the instance's .to(dtype) does).
/// Runs on the current stream; does not wait for it. Throws std::invalid_argument as
/// ImageProcessor::preprocess does (an empty batch, a non-(3, h, w) uint8 image, sizes that
/// differ without do_pad), and for an `out` of another batch size or smaller than an image's
/// output size (naming both).
void preprocess_into(const kernels::ImagePreprocessHandle& handle, const ImageProcessor& processor,
                     const std::vector<at::Tensor>& images, const at::Tensor& out);

/// ImageProcessor::preprocess through the slot: pixel_values (B, 3, H, W) in `dtype` and
/// `format` on the images' device (H, W the largest output size; preprocess_into), pixel_mask
/// (B, H, W) int64 when do_pad, original_sizes; pixel_u8 is left undefined (the slot makes no
/// uint8 copy). Throws as preprocess_into.
ProcessorOutput preprocess(const kernels::ImagePreprocessHandle& handle,
                           const ImageProcessor& processor, const std::vector<at::Tensor>& images,
                           at::ScalarType dtype,
                           at::MemoryFormat format = at::MemoryFormat::Contiguous);

}  // namespace libreyolo::image
