// The `image_decode` kernel slot seen from models/: its reference (this library's libjpeg-turbo /
// libpng decoder, models/image/decode.h) and the entry point callers decode through, so that an
// accelerated decoder (kernels/image/image_decode.h: `nvjpeg`) takes what it can and every other
// image reaches the reference, with the CPU path's exact errors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/registry.h"
#include "models/image/decode.h"

namespace libreyolo::image {

/// Registers the slot's `reference` into `registry` (declaring the slot if needed): decode_rgb
/// with the options' limits, the given EXIF orientation applied, as (3, H, W) uint8 on the CPU
/// (to_chw_tensor); an ImageError becomes DecodedImage::error (never thrown: a client's bytes
/// must not disable the reference). libreyolo_models registers it into
/// kernels::Registry::process_default() when it loads; tests call it on their own registries.
void register_image_decode_reference(kernels::Registry& registry);

/// Decodes one encoded image through `handle` (bound for the caller's device: Registry::bind
/// with kernels::kImageDecode), or with decode_image() (processor.h) when the handle is empty or
/// every candidate declined. `device_index` >= 0 asks for the pixels on that CUDA device (an
/// implementation that cannot put them there declines; the reference's come back on the CPU:
/// the caller moves them if it needs to). The EXIF orientation is read here (image_orientation)
/// when options.apply_orientation.
/// Returns (3, H, W) uint8 contiguous. Throws ImageError with decode_rgb's messages for empty,
/// unknown, corrupt, truncated or too large input.
at::Tensor decode_image(const kernels::ImageDecodeHandle& handle, const uint8_t* data,
                        std::size_t size, const DecodeOptions& options, int device_index);

/// Decodes several encoded images through `batch` (bound with kernels::kImageDecodeBatch for the
/// same device as `single`), then each image the batch left (declined) through decode_image
/// above with `single`. An empty `batch` decodes every image through `single`.
/// Returns one DecodedImage per input, in order: its pixels as decode_image returns them, or
/// the ImageError text decode_image would throw for it in `error` (the other images still
/// decode: the caller names the bad one). Exceptions other than ImageError (the device's out of
/// memory: kernels::OutOfMemory) propagate.
std::vector<kernels::DecodedImage> decode_images(const kernels::ImageDecodeBatchHandle& batch,
                                                 const kernels::ImageDecodeHandle& single,
                                                 const std::vector<kernels::EncodedImage>& images,
                                                 const DecodeOptions& options, int device_index);

}  // namespace libreyolo::image
