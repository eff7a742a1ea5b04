// Image processors driven by preprocessor_config.json: RTDetrImageProcessor,
// DeformableDetrImageProcessor (and GroundingDinoImageProcessor, the same class defaults and
// steps), RfDetrImageProcessor, ViTImageProcessor, DeiTImageProcessor and
// YolosImageProcessor (DETR's, but its aspect-ratio resize floors both sides to multiples of 16)
// (transformers 5.17, torchvision backend: resize on uint8, center crop, fused rescale/normalize,
// bottom/right padding with a pixel mask; RfDetrImageProcessor instead rescales, resizes the
// float32 image, then normalises: modular_rf_detr.py RfDetrImageProcessor._preprocess).
// Formulas: transformers' image_processing_rt_detr.py, image_processing_deformable_detr.py,
// image_processing_rf_detr.py, image_processing_vit.py, image_processing_deit.py,
// image_processing_backends.py and image_transforms.py (v5.17); checked against the fixtures'
// pixel_u8 (tests/parity, tests/unit/image_processor_test.cpp).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/image/decode.h"

namespace libreyolo::image {

/// Largest image side a preprocessor_config.json may ask for (size.*, max_size), pixels.
constexpr int64_t kMaxProcessorSize = 65536;

/// Largest square side Owlv2ImageProcessor's padding may make (owlv2_pixel_values): 8192 x 8192
/// float32 RGB is 805 MB before the blur's copies.
constexpr int64_t kOwlv2MaxPaddedSide = 8192;

/// PPDocLayoutV2/V3ImageProcessor (800x800 bicubic without antialias, mean 0, std 1) are among
/// the classes below.
/// OwlViTImageProcessor (768x768 bicubic, CLIP mean/std) and Owlv2ImageProcessor (960x960, its
/// own pipeline: owlv2_pixel_values) too.
/// The settings of one processor. Keys missing from the file take the class defaults of
/// `image_processor_type` (RTDetr: 640x640, rescale only; DeformableDetr and RfDetr: shortest
/// 800 / longest 1333, ImageNet mean/std, pad; ViT: 224x224, mean = std = 0.5; DeiT: 256x256
/// bicubic, center crop 224x224, mean = std = 0.5; Yolos: DeformableDetr's). RfDetrImageProcessor
/// rejects do_center_crop. A file without image_processor_type but with a legacy
/// feature_extractor_type ("YolosFeatureExtractor", hustvl/yolos-*) names the matching
/// ImageProcessor, as transformers' AutoImageProcessor reads it.
struct ProcessorConfig {
  std::string image_processor_type;  ///< e.g. "RTDetrImageProcessor"
  bool do_resize = true;
  int64_t height = 0, width = 0;                ///< size {height, width}: exact resize
  int64_t shortest_edge = 0, longest_edge = 0;  ///< size {shortest_edge[, longest_edge]}
  /// YolosImageProcessor: {shortest_edge, longest_edge} resizes with
  /// size_with_aspect_ratio_yolos (both sides floored to multiples of 16), not
  /// size_with_aspect_ratio. Set from image_processor_type, not a JSON key.
  bool yolos_resize = false;
  int resample = 2;  ///< PIL enum: 0 nearest, 2 bilinear, 3 bicubic
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = false;
  std::array<float, 3> image_mean{0.f, 0.f, 0.f};
  std::array<float, 3> image_std{1.f, 1.f, 1.f};
  bool do_pad = false;  ///< pad a batch to its largest H, W (bottom/right zeros) + pixel_mask
  /// crop_size {height, width} (or a legacy int: square) cut from the centre after the resize,
  /// zero padded first where the image is smaller (TorchvisionBackend.center_crop).
  bool do_center_crop = false;
  int64_t crop_height = 0, crop_width = 0;
  /// Not a JSON key: the class's resize kernel. PPDocLayoutV2/V3ImageProcessor resize with
  /// antialias=False ("to approximate the output of cv2.resize"), the others antialiased.
  bool antialias = true;
  /// Not a JSON key: Owlv2ImageProcessor's own pipeline (owlv2_pixel_values): rescale, pad to a
  /// square (do_pad), Gaussian anti-aliasing, bilinear resize without antialias, normalise.
  bool owlv2 = false;

  /// How bilinear resizes uint8 (not a JSON key). `automatic`: ATen's native uint8
  /// antialiased kernel on CPU tensors (what torchvision runs on CPUs whose ATen capability is
  /// "AVX2"; the fixtures were made that way and match it bit for bit), float32 -> round
  /// elsewhere. torchvision itself takes the float32 -> round path on "AVX512" CPUs, which
  /// differs by 1 in ~15 % of values (measured in tests/parity/postprocess_parity_test.cpp).
  enum class Uint8Resize { automatic, native_uint8, float32_round };
  Uint8Resize uint8_resize = Uint8Resize::automatic;

  /// Parses the JSON text; `source` names the file in error messages.
  /// Throws std::runtime_error naming the source and key (unknown processor type, unsupported
  /// resample, malformed size or a side outside 1..kMaxProcessorSize, wrong value types).
  static ProcessorConfig from_json(const std::string& text, const std::string& source);
  /// Reads <path> (a preprocessor_config.json) and parses it. Throws std::runtime_error naming
  /// the path when it cannot be opened or exceeds 16 MiB (models::core::read_json_text), or as
  /// from_json.
  static ProcessorConfig from_file(const std::string& path);
};

/// transformers' get_size_with_aspect_ratio((height, width), shortest_edge, longest_edge)
/// (image_transforms.py): Python's round-half-even and int() truncation on doubles.
/// longest_edge <= 0 means none. Returns (out_height, out_width). Throws c10::ValueError when the
/// short side rounds to 0 (an image at least 2 * longest_edge times longer than wide).
std::pair<int64_t, int64_t> size_with_aspect_ratio(int64_t height, int64_t width,
                                                   int64_t shortest_edge, int64_t longest_edge);

/// transformers' get_size_with_aspect_ratio_yolos((height, width), shortest_edge, longest_edge,
/// mod_size=16) (models/yolos/image_processing_yolos.py): the width < height branch is taken
/// before the "already the size" one (unlike size_with_aspect_ratio), then each side is floored
/// to a multiple of 16. Throws c10::ValueError when a side floors to 0 (an image over 16 times
/// longer than wide: transformers fails to resize it too). Returns (out_height, out_width).
std::pair<int64_t, int64_t> size_with_aspect_ratio_yolos(int64_t height, int64_t width,
                                                         int64_t shortest_edge,
                                                         int64_t longest_edge);

/// Owlv2ImageProcessor._preprocess of one (3, H, W) uint8 image (transformers 5.17
/// models/owlv2/image_processing_owlv2.py): x = u8 * rescale_factor (do_rescale); padded
/// bottom/right with zeros to a max(H, W) square (do_pad); then, resizing (do_resize) to
/// (height, width), the `resize` there: with factors = side / size (float32) and sigma =
/// max((factors - 1) / 2, 0), when both sigmas are positive a torchvision gaussian_blur (kernel
/// 2 * ceil(3 * sigma) + 1, reflect padding, kernel1d = softmax(-(linspace(-lim, lim, k) /
/// sigma)^2), lim = (k - 1) / (2 sqrt 2)), then bilinear interpolation without antialias; then
/// (x - mean) / std (do_normalize). Returns (3, height, width) float32 on the image's device.
/// The blur runs as two 1-D passes (the same kernel, float32 rounding apart). Throws
/// std::invalid_argument "image WxH: Owlv2ImageProcessor pads it to a SxS square, larger than
/// the 8192x8192 this server preprocesses (resize it first)" when do_pad makes a side above
/// kOwlv2MaxPaddedSide (a thin image within the decoder's limit would need gigabytes).
at::Tensor owlv2_pixel_values(const ProcessorConfig& config, const at::Tensor& image_u8);

/// RfDetrImageProcessor (modular_rf_detr.py RfDetrImageProcessor._preprocess: "Rescale then
/// resize like in the original RF-DETR implementation"): pixel_values are float32(u8) *
/// rescale_factor, resized in float32 (antialiased), then normalised (tvF.normalize), instead of
/// the uint8 resize and the fused rescale/normalize of the other DETR processors. pixel_u8 stays
/// the uint8 resize (for display). do_center_crop is rejected with it.
bool rescale_before_resize(const ProcessorConfig& config);

/// The float32 (mean, std) per channel that ImageProcessor::rescale_normalize subtracts and
/// divides by with do_normalize: image_mean and image_std times float32(1 / rescale_factor)
/// (1 without do_rescale; transformers' _fuse_mean_std_and_rescale_factor).
std::pair<std::array<float, 3>, std::array<float, 3>> fused_mean_std(const ProcessorConfig& config);

/// The processed batch.
struct ProcessorOutput {
  /// (B, 3, H, W) uint8 after resize, zero padded. RfDetrImageProcessor: the uint8 resize of
  /// the images (for display); pixel_values are not computed from it.
  at::Tensor pixel_u8;
  at::Tensor pixel_values;  ///< (B, 3, H, W) float32, rescaled / normalised, 0 in the padding
  at::Tensor pixel_mask;    ///< (B, H, W) int64, 1 on real pixels; defined only when do_pad
  std::vector<std::pair<int64_t, int64_t>> original_sizes;  ///< per image (H, W) before resize
};

/// One processor. Stateless after construction; safe to share between threads.
class ImageProcessor {
 public:
  explicit ImageProcessor(ProcessorConfig config);

  const ProcessorConfig& config() const { return config_; }

  /// Output (H, W) of preprocess() for an input of (height, width): the resize's, or the
  /// crop's when do_center_crop.
  std::pair<int64_t, int64_t> output_size(int64_t height, int64_t width) const;

  /// Resizes one image (3, H, W) uint8 like torchvision's resize(antialias=True): antialiased
  /// bilinear through ATen (at::_upsample_bilinear2d_aa), see ProcessorConfig::uint8_resize.
  /// No center crop (preprocess() applies it after).
  at::Tensor resize(const at::Tensor& image_u8) const;

  /// transformers TorchvisionBackend.center_crop of one (3, H, W) image to crop_height x
  /// crop_width: zero padding (left/top (c - s) // 2) where the image is smaller, then the
  /// window at top = int((H - ch) / 2), left = int((W - cw) / 2). Returns `image_u8` when
  /// do_center_crop is off. Throws c10::ValueError for a non-(3, H, W) input.
  at::Tensor center_crop(const at::Tensor& image_u8) const;

  /// float32(u8) * float32(rescale_factor), or (float32(u8) - mean*255f) / (std*255f) when
  /// do_normalize (torchvision's fused normalize); any (..., 3, H, W) uint8 input. Not
  /// RfDetrImageProcessor's pixel_values (preprocess() rescales, resizes and normalises those).
  at::Tensor rescale_normalize(const at::Tensor& pixel_u8) const;

  /// Resizes, center-crops (do_center_crop), pads (do_pad, or always when the sizes differ and
  /// do_pad is off: an error) and normalises a batch of (3, H, W) uint8 images
  /// (RfDetrImageProcessor: pixel_values = normalise(resize_float32(float32(u8) *
  /// rescale_factor)), antialiased, as transformers' torchvision backend). Throws
  /// std::invalid_argument for an empty batch, a non-(3,H,W) uint8 image, or different sizes
  /// without do_pad.
  ProcessorOutput preprocess(const std::vector<at::Tensor>& images) const;

 private:
  /// preprocess() of Owlv2ImageProcessor: owlv2_pixel_values per image, no pixel_mask;
  /// pixel_u8 = round(clamp(unnormalised * 255)), for display.
  ProcessorOutput preprocess_owlv2(const std::vector<at::Tensor>& images) const;

  ProcessorConfig config_;
};

/// The processor of a checkpoint folder: <dir>/preprocessor_config.json read with the size cap
/// and clipped parse errors of models/core/config.h. Throws std::runtime_error naming the file.
std::unique_ptr<ImageProcessor> load_image_processor(const std::string& dir);

/// RgbImage (interleaved) -> (3, H, W) uint8 tensor (copies the pixels once): a permuted view of
/// the interleaved (H, W, 3) buffer, strides (1, 3 W, 3), not contiguous. ATen's uint8 resize
/// reads interleaved pixels faster than planes (decode + RT-DETR's resize 2.70 -> 2.36 ms per
/// 512x512 JPEG, tools/bench_preprocess); ImageProcessor::resize returns contiguous planes.
at::Tensor to_chw_tensor(const RgbImage& image);

/// decode_rgb + to_chw_tensor. Throws ImageError.
at::Tensor decode_image(const uint8_t* data, size_t size, const DecodeOptions& options = {});

/// Reads and decodes a file. Throws ImageError naming the path.
at::Tensor decode_image_file(const std::string& path, const DecodeOptions& options = {});

}  // namespace libreyolo::image
