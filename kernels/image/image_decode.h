// The `image_decode` slot: encoded image bytes -> 8-bit RGB pixels, as PIL's
// `Image.open(f).convert("RGB")` gives them (what transformers' load_image and the fixtures use).
//
// Implementations:
//   reference  libjpeg-turbo / libpng (models/image/decode.cpp), registered by libreyolo_models
//              (models/image/decode_slot.cpp), where that decoder lives; host memory.
//   nvjpeg     nvJPEG (kernels/image/cuda/nvjpeg_decode.cpp), loaded with dlopen at start-up:
//              the hardware backend where the GPU has JPEG engines (A100, H100/H200), else the
//              default (hybrid) backend; decodes straight into device memory. Declines (to the
//              reference) what kernels/image/jpeg_header.h's baseline_decline_reason refuses
//              and what nvJPEG itself rejects.
// `image_decode_batch` (below) is its batch variant: `nvjpeg` there decodes the JPEGs it takes
// with one nvjpegDecodeBatched call on the hardware backend.
// An implementation never throws for bad input: the reference returns the CPU path's error
// text in DecodedImage::error (the entry point, models/image/decode_slot.h, throws it as
// image::ImageError, INVALID_ARGUMENT for the server) and the accelerated ones decline, so a
// client's bytes never disable an implementation.
//
// Shapes and dtypes: the result is (3, H, W) uint8, contiguous, channels R, G, B, in the
// displayed frame (the EXIF orientation in ImageDecodeOptions applied: 5-8 swap H and W).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/slot.h"

namespace libreyolo::kernels {

class Provider;  // kernels/registry.h

/// The bytes of one encoded image (JPEG, PNG); not owned, valid for the call.
struct EncodedImage {
  const uint8_t* data = nullptr;
  std::size_t size = 0;
};

/// How to decode (image::DecodeOptions plus where the pixels go).
struct ImageDecodeOptions {
  int64_t max_pixels = 40'000'000;  ///< width * height above it is an error (from the header)
  bool strict_jpeg = true;          ///< libjpeg warnings are errors (the reference)
  int orientation = 1;              ///< EXIF orientation 1-8 to apply (the caller reads it)
  int device_index = -1;            ///< -1: host memory; >= 0: pixels on that CUDA device
};

/// What an implementation returns: pixels, or the input's error (never both).
struct DecodedImage {
  at::Tensor pixels;  ///< (3, H, W) uint8 contiguous; CPU from the reference, CUDA from nvjpeg
  std::string error;  ///< non-empty: the image is bad (the CPU path's ImageError text)
};

/// The slot's declaration.
inline constexpr SlotDef<DecodedImage(const EncodedImage& image, const ImageDecodeOptions& options)>
    kImageDecode{"image_decode"};
using ImageDecodeHandle = Handle<decltype(kImageDecode)::Signature>;
using ImageDecodeImpl = decltype(kImageDecode)::Fn;

/// The `image_decode_batch` slot: several images of one call decoded together, where a decoder
/// does better with a batch (nvJPEG's hardware backend: nvjpegDecodeBatched keeps every JPEG
/// engine busy). No reference: the batch variant of `image_decode`, not a second way to decode
/// one image. An implementation returns one DecodedImage per input, in order; an image it does
/// not take (what `image_decode`'s same implementation would decline, or whatever nvJPEG
/// refuses in the batch) comes back empty (pixels undefined, error "") and the entry point
/// (models/image/decode_slot.h decode_images) decodes it through `image_decode`, where the
/// decline is counted with its reason and the reference answers. A whole-call Decline (e.g. host
/// output, no hardware backend) sends every image that way. `orientations` (one per image, 1-8)
/// replaces options.orientation; the pixels of each image are as `image_decode` gives them.
inline constexpr SlotDef<std::vector<DecodedImage>(const std::vector<EncodedImage>& images,
                                                   const std::vector<int>& orientations,
                                                   const ImageDecodeOptions& options)>
    kImageDecodeBatch{"image_decode_batch"};
using ImageDecodeBatchHandle = Handle<decltype(kImageDecodeBatch)::Signature>;
using ImageDecodeBatchImpl = decltype(kImageDecodeBatch)::Fn;

/// The `nvjpeg` provider (kernels/image/cuda/nvjpeg_decode.cpp), or null in a build without
/// CUDA. Unavailable (not loaded; the reason in /active `providers`) when no CUDA device is
/// usable or libnvjpeg cannot be opened (dlopen: libnvjpeg.so.13 on the loader's path, then
/// $CUDA_HOME/lib64, /usr/local/cuda/lib64, the torch wheel's nvidia/cu13/lib).
std::shared_ptr<Provider> make_nvjpeg_provider();

}  // namespace libreyolo::kernels
