// The `image_preprocess` slot: decoded images (the `image_decode` slot's (3, h, w) uint8 pixels)
// -> the model's batch tensor, as the image processor makes it: resize, rescale, normalise,
// bottom/right zero padding, written into a caller-given output in the model's dtype and memory
// format.
//
// Implementations:
//   portable  the image processor's ATen ops (models/image/preprocess_slot.h preprocess_into:
//             ImageProcessor::preprocess, then a copy into the output): no registered reference,
//             as add_layer_norm's portable path.
//   cuda      one kernel per launch of up to kMaxImagesPerLaunch images (kernels/image/cuda/
//             image_preprocess_cuda.h): each output pixel computed from the uint8 pixels, written
//             once; no intermediate tensor. Declines (counted per reason) whatever
//             image_preprocess_decline_reason names; those batches take the portable path.
//
// The numbers the `cuda` implementation reproduces (the portable path on a CUDA image,
// transformers 5.17's torchvision backend as models/image/processor.h runs it there):
//   u8'  = round_half_even(at::_upsample_bilinear2d_aa(float32(u8), (h', w'))): ATen's CUDA
//          antialiased kernel (aten/src/ATen/native/cuda/UpSampleBilinear2d.cu
//          upsample_gen2d_aa_out_frame, weights of UpSample.cuh upsample_antialias::
//          _compute_weights: PIL's triangle filter widened by the scale, normalised), rows first
//          then columns, in float32; then torchvision's round back to uint8.
//   value = (float32(u8') - mean_scaled[c]) / std_scaled[c]   (normalize: true)
//         | float32(u8') * rescale_factor                      (rescale only)
//         | float32(u8')                                       (neither)
//   out   = value rounded to the output dtype (round to nearest even), 0 in the padding.
// With rescale_before_resize (RfDetrImageProcessor, models/image/processor.h
// rescale_resize_normalize) the rescale comes first and nothing is rounded to uint8:
//   x     = float32(u8) * rescale_factor                       (each pixel, one rounded product)
//   value = (at::_upsample_bilinear2d_aa(x, (h', w')) - mean[c]) / std[c]   (normalize: true)
//         | at::_upsample_bilinear2d_aa(x, (h', w'))                        (otherwise)
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// What one call asks for: the processor's settings as the numbers above, with the steps an
/// implementation may not do (each one a decline reason) named.
struct ImagePreprocessSpec {
  /// Per image, in order: the (height, width) it is resized to (ImageProcessor::output_size).
  /// Each image fills the top-left (h', w') of its row of the output; the rest of the row is 0.
  std::vector<std::pair<int64_t, int64_t>> sizes;
  int resample = 2;           ///< PIL enum: 2 bilinear (the only one `cuda` takes), 0, 3
  bool antialias = true;      ///< torchvision resize(antialias=...)
  bool native_uint8 = false;  ///< ATen's uint8 resize kernel asked for (CPU numerics)
  bool center_crop = false;   ///< do_center_crop (ViT/DeiT-style)
  /// RfDetrImageProcessor: the float32 resize of float32(u8) * rescale_factor (1 without
  /// do_rescale), then (x - mean) / std with `mean` / `std` for Values::normalize, else raw.
  bool rescale_before_resize = false;
  bool owlv2 = false;  ///< Owlv2ImageProcessor's own pipeline
  enum class Values { raw, rescale, normalize };
  Values values = Values::rescale;
  /// float32(rescale_factor): for Values::rescale; with rescale_before_resize for every Values
  /// (1 for a processor without do_rescale).
  float rescale_factor = 1.0f / 255.0f;
  /// For Values::normalize: mean * (1 / rescale_factor) and std * (1 / rescale_factor) in
  /// float32 (transformers' _fuse_mean_std_and_rescale_factor), per channel R, G, B.
  std::array<float, 3> mean_scaled{0.f, 0.f, 0.f};
  std::array<float, 3> std_scaled{1.f, 1.f, 1.f};
  /// For rescale_before_resize with Values::normalize: image_mean and image_std as float32.
  std::array<float, 3> mean{0.f, 0.f, 0.f};
  std::array<float, 3> std{1.f, 1.f, 1.f};
};

/// The slot's declaration. `images`: B tensors (3, h, w) uint8; `out`: (B, 3, H, W) with
/// H >= every h' and W >= every w' (the entry point checks). Returns `out`, written.
inline constexpr SlotDef<at::Tensor(const std::vector<at::Tensor>& images,
                                    const ImagePreprocessSpec& spec, const at::Tensor& out)>
    kImagePreprocess{"image_preprocess"};
using ImagePreprocessHandle = Handle<decltype(kImagePreprocess)::Signature>;
using ImagePreprocessImpl = decltype(kImagePreprocess)::Fn;

/// The decline reasons of the `cuda` implementation (string literals: /active counts them).
inline constexpr const char* kPreprocessNotBilinear = "cuda: resample is not bilinear";
inline constexpr const char* kPreprocessNoAntialias = "cuda: resize without antialias";
inline constexpr const char* kPreprocessNativeUint8 = "cuda: native uint8 resize (CPU numerics)";
inline constexpr const char* kPreprocessCenterCrop = "cuda: center crop";
inline constexpr const char* kPreprocessOwlv2 = "cuda: Owlv2ImageProcessor pipeline";
inline constexpr const char* kPreprocessOutput =
    "cuda: output not a CUDA float32/float16/bfloat16 tensor, contiguous or channels_last";
inline constexpr const char* kPreprocessImage =
    "cuda: an image not a contiguous (3, h, w) uint8 tensor on the output's device";
inline constexpr const char* kPreprocessWide =
    "cuda: resize support too wide (a downscale over 150x)";

/// Why the `cuda` implementation declines this call, or nullptr when it takes it. The settings
/// are checked first, then the tensors, so a CPU test sees each setting's reason. Host-side only;
/// never throws.
const char* image_preprocess_decline_reason(const std::vector<at::Tensor>& images,
                                            const ImagePreprocessSpec& spec, const at::Tensor& out);

/// The widest resize support the `cuda` kernel holds in shared memory, as the taps of one output
/// pixel along one axis (resize_taps): 301, a scale of 150.
inline constexpr int kMaxPreprocessTaps = 301;

/// ATen's scale of a resize from `in` to `out` pixels along one axis: float32(in) / out
/// (UpSample.cuh area_pixel_compute_scale without align_corners or a given scale).
inline float resize_scale(int64_t in, int64_t out) {
  return static_cast<float>(in) / static_cast<float>(out);
}

/// The taps the antialiased bilinear kernel reserves per output pixel along one axis:
/// 1 + 2 * ceil(support), support = scale for a downscale (scale >= 1), else 1
/// (upsample_gen2d_aa_out_cuda_template's interp_height / interp_width).
int resize_taps(int64_t in, int64_t out);

}  // namespace libreyolo::kernels
