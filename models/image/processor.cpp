// ImageProcessor: transformers 5.17 torchvision-backend numerics (see processor.h;
// RfDetrImageProcessor: rescale_before_resize below).
#include "models/image/processor.h"

#include "kernels/policy.h"
#include "models/core/config.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace libreyolo::image {
namespace {

using nlohmann::json;

std::string strip_suffix(std::string name) {
  for (const char* suffix : {"Fast", "Pil"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      name.resize(name.size() - s.size());
  }
  return name;
}

// Class defaults (transformers 5.17 image_processing_*.py).
ProcessorConfig class_defaults(const std::string& type, const std::string& source) {
  ProcessorConfig c;
  c.image_processor_type = type;
  const std::string base = strip_suffix(type);
  const std::array<float, 3> imagenet_mean{0.485f, 0.456f, 0.406f};
  const std::array<float, 3> imagenet_std{0.229f, 0.224f, 0.225f};
  if (base == "RTDetrImageProcessor") {
    c.height = c.width = 640;
    c.image_mean = imagenet_mean;
    c.image_std = imagenet_std;
  } else if (base == "DeformableDetrImageProcessor" || base == "DetrImageProcessor" ||
             base == "ConditionalDetrImageProcessor" || base == "RfDetrImageProcessor" ||
             base == "YolosImageProcessor" || base == "GroundingDinoImageProcessor") {
    c.yolos_resize = base == "YolosImageProcessor";
    c.shortest_edge = 800;
    c.longest_edge = 1333;
    c.do_normalize = true;
    c.image_mean = imagenet_mean;
    c.image_std = imagenet_std;
    c.do_pad = true;
  } else if (base == "ViTImageProcessor") {
    c.height = c.width = 224;
    c.do_normalize = true;
    c.image_mean = {0.5f, 0.5f, 0.5f};
    c.image_std = {0.5f, 0.5f, 0.5f};
  } else if (base == "PPDocLayoutV3ImageProcessor" || base == "PPDocLayoutV2ImageProcessor") {
    // image_processing_pp_doclayout_v3.py: size 800x800, BICUBIC, rescale then normalise with
    // mean 0 / std 1, resize(antialias=False).
    c.height = c.width = 800;
    c.resample = 3;
    c.do_normalize = true;
    c.antialias = false;
  } else if (base == "OwlViTImageProcessor" || base == "Owlv2ImageProcessor") {
    // image_processing_owlvit.py / image_processing_owlv2.py: OPENAI_CLIP_MEAN / _STD.
    c.owlv2 = base == "Owlv2ImageProcessor";
    c.height = c.width = c.owlv2 ? 960 : 768;
    c.resample = c.owlv2 ? 2 : 3;
    c.crop_height = c.crop_width = c.owlv2 ? 0 : 768;
    c.do_pad = c.owlv2;  // OWLv2: pad to a square (not to the batch's largest image)
    c.do_normalize = true;
    c.image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
    c.image_std = {0.26862954f, 0.26130258f, 0.27577711f};
  } else if (base == "DeiTImageProcessor") {
    c.height = c.width = 256;
    c.resample = 3;  // PILImageResampling.BICUBIC
    c.do_center_crop = true;
    c.crop_height = c.crop_width = 224;
    c.do_normalize = true;
    c.image_mean = {0.5f, 0.5f, 0.5f};  // IMAGENET_STANDARD_MEAN / _STD
    c.image_std = {0.5f, 0.5f, 0.5f};
  } else {
    // Control characters as \xNN: a JSON escape must not make a two-line error
    // (a model_config_fuzz finding).
    throw std::runtime_error(source + ": image_processor_type \"" + kernels::printable(type) +
                             "\" is not supported (RTDetrImageProcessor, "
                             "DeformableDetrImageProcessor, RfDetrImageProcessor, "
                             "ViTImageProcessor, "
                             "DeiTImageProcessor, YolosImageProcessor, OwlViTImageProcessor, "
                             "Owlv2ImageProcessor)");
  }
  return c;
}

template <typename T>
T get_as(const json& j, const char* key, const std::string& source) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(source + ": key \"" + key + "\" has a wrong type (" + e.what() + ")");
  }
}

/// j[key] as an integer. A JSON float is refused: nlohmann's get<int64_t>() of 9e19 is a double ->
/// int64 conversion out of range (undefined behaviour: model_config_fuzz,
/// tests/fuzz/corpus/model_config/regress-float-edge-9e19.json).
int64_t get_integer(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    throw std::runtime_error(source + ": key \"" + key + "\" must be an integer, got " +
                             v.dump().substr(0, 64));
  return v.get<int64_t>();
}

std::array<float, 3> get_rgb(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  std::array<float, 3> out{};
  if (v.is_number()) {
    out.fill(v.get<float>());
    return out;
  }
  if (!v.is_array() || v.size() != 3)
    throw std::runtime_error(source + ": key \"" + key + "\" must be a number or 3 numbers");
  for (size_t i = 0; i < 3; ++i) {
    if (!v[i].is_number())
      throw std::runtime_error(source + ": key \"" + key + "\" must hold numbers");
    // float32(python float): what torch.tensor(list) stores.
    out[i] = static_cast<float>(v[i].get<double>());
  }
  return out;
}

/// An image side in pixels: 1 to kMaxProcessorSize. transformers sets no bound; without one a
/// shortest_edge of 9e18 overflowed the resize arithmetic (size_with_aspect_ratio's double ->
/// int64 conversion: model_config_fuzz, tests/fuzz/corpus/model_config/
/// regress-shortest-edge-9e18.json).
int64_t checked_side(int64_t v, const std::string& what, const std::string& source) {
  if (v <= 0 || v > kMaxProcessorSize)
    throw std::runtime_error(source + ": " + what + " must be from 1 to " +
                             std::to_string(kMaxProcessorSize) + " pixels, got " +
                             std::to_string(v));
  return v;
}

// The size dict variants transformers accepts for these processors.
void parse_size(const json& size, ProcessorConfig& c, const std::string& source) {
  if (size.is_number_integer()) {  // legacy int: ViT -> square, DETR -> shortest edge
    const int64_t v = checked_side(size.get<int64_t>(), "size", source);
    if (c.shortest_edge > 0) {
      c.shortest_edge = v;
    } else {
      c.height = c.width = v;
    }
    return;
  }
  if (!size.is_object()) throw std::runtime_error(source + ": key \"size\" must be an object");
  auto positive = [&](const char* key) {
    return checked_side(get_integer(size, key, source + " size"), std::string("size.") + key,
                        source);
  };
  if (size.contains("height") || size.contains("width")) {
    if (!size.contains("height") || !size.contains("width"))
      throw std::runtime_error(source + ": size needs both height and width");
    c.height = positive("height");
    c.width = positive("width");
    c.shortest_edge = c.longest_edge = 0;
  } else if (size.contains("shortest_edge")) {
    c.shortest_edge = positive("shortest_edge");
    c.longest_edge = size.contains("longest_edge") && !size["longest_edge"].is_null()
                         ? positive("longest_edge")
                         : 0;
    c.height = c.width = 0;
  } else {
    throw std::runtime_error(source + ": size " + size.dump() +
                             " is not supported ({height, width} or {shortest_edge, "
                             "longest_edge})");
  }
}

// crop_size: {height, width} or a legacy int (get_size_dict(default_to_square=True): square).
void parse_crop_size(const json& size, ProcessorConfig& c, const std::string& source) {
  if (size.is_number_integer()) {
    c.crop_height = c.crop_width = checked_side(size.get<int64_t>(), "crop_size", source);
    return;
  }
  if (!size.is_object() || !size.contains("height") || !size.contains("width"))
    throw std::runtime_error(source + ": crop_size must be an integer or {height, width}");
  c.crop_height =
      checked_side(get_integer(size, "height", source + " crop_size"), "crop_size.height", source);
  c.crop_width =
      checked_side(get_integer(size, "width", source + " crop_size"), "crop_size.width", source);
}

/// (H, W) after the resize alone (no crop).
std::pair<int64_t, int64_t> resized_size(const ProcessorConfig& c, int64_t height, int64_t width) {
  if (!c.do_resize) return {height, width};
  if (c.height > 0) return {c.height, c.width};
  if (c.yolos_resize)
    return size_with_aspect_ratio_yolos(height, width, c.shortest_edge, c.longest_edge);
  return size_with_aspect_ratio(height, width, c.shortest_edge, c.longest_edge);
}

// Python's int(round(x)) (half to even) and int(x) (toward zero) on doubles.
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }
int64_t py_int(double x) { return static_cast<int64_t>(std::trunc(x)); }

}  // namespace

bool rescale_before_resize(const ProcessorConfig& c) {
  return strip_suffix(c.image_processor_type) == "RfDetrImageProcessor";
}

std::pair<std::array<float, 3>, std::array<float, 3>> fused_mean_std(const ProcessorConfig& c) {
  // transformers _fuse_mean_std_and_rescale_factor: mean and std times 1 / rescale_factor.
  const float inv = c.do_rescale ? static_cast<float>(1.0 / c.rescale_factor) : 1.0f;
  std::array<float, 3> m{}, s{};
  for (int i = 0; i < 3; ++i) {
    m[i] = c.image_mean[i] * inv;
    s[i] = c.image_std[i] * inv;
  }
  return {m, s};
}

ProcessorConfig ProcessorConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(source + ": not valid JSON (" +
                             models::core::clip_json_error(e.what()) + ")");
  }
  if (!j.is_object()) throw std::runtime_error(source + ": not a JSON object");
  std::string type;
  if (j.contains("image_processor_type")) {
    type = get_as<std::string>(j, "image_processor_type", source);
  } else if (j.contains("feature_extractor_type")) {
    // transformers' AutoImageProcessor: "<X>FeatureExtractor" names "<X>ImageProcessor"
    // (hustvl/yolos-*'s files carry only feature_extractor_type "YolosFeatureExtractor").
    type = get_as<std::string>(j, "feature_extractor_type", source);
    const std::string legacy = "FeatureExtractor";
    if (type.size() > legacy.size() &&
        type.compare(type.size() - legacy.size(), legacy.size(), legacy) == 0)
      type = type.substr(0, type.size() - legacy.size()) + "ImageProcessor";
  } else {
    throw std::runtime_error(source + ": key \"image_processor_type\" is missing");
  }
  ProcessorConfig c = class_defaults(type, source);
  if (j.contains("do_resize")) c.do_resize = get_as<bool>(j, "do_resize", source);
  if (j.contains("size") && !j["size"].is_null()) parse_size(j["size"], c, source);
  if (j.contains("max_size") && j["max_size"].is_number_integer() && c.shortest_edge > 0)
    c.longest_edge = checked_side(j["max_size"].get<int64_t>(), "max_size", source);  // legacy
  if (j.contains("resample") && !j["resample"].is_null()) {
    const int64_t resample = get_integer(j, "resample", source);
    if (resample != 0 && resample != 2 && resample != 3)
      throw std::runtime_error(source + ": resample " + std::to_string(resample) +
                               " is not supported (0 nearest, 2 bilinear, 3 bicubic)");
    c.resample = static_cast<int>(resample);
  }
  if (j.contains("do_rescale")) c.do_rescale = get_as<bool>(j, "do_rescale", source);
  // Early OWL-ViT files on the Hub name do_rescale "rescale" (OwlViTImageProcessor.__init__).
  if (!j.contains("do_rescale") && j.contains("rescale") && j["rescale"].is_boolean())
    c.do_rescale = j["rescale"].get<bool>();
  if (j.contains("rescale_factor")) c.rescale_factor = get_as<double>(j, "rescale_factor", source);
  if (j.contains("do_normalize")) c.do_normalize = get_as<bool>(j, "do_normalize", source);
  if (j.contains("image_mean") && !j["image_mean"].is_null())
    c.image_mean = get_rgb(j, "image_mean", source);
  if (j.contains("image_std") && !j["image_std"].is_null())
    c.image_std = get_rgb(j, "image_std", source);
  if (j.contains("do_pad") && !j["do_pad"].is_null()) c.do_pad = get_as<bool>(j, "do_pad", source);
  if (j.contains("do_center_crop") && !j["do_center_crop"].is_null())
    c.do_center_crop = get_as<bool>(j, "do_center_crop", source);
  if (j.contains("crop_size") && !j["crop_size"].is_null())
    parse_crop_size(j["crop_size"], c, source);
  if (c.owlv2 && c.do_resize && c.height <= 0)
    throw std::runtime_error(source + ": Owlv2ImageProcessor needs size {height, width}");
  if (c.owlv2 && c.do_center_crop)
    throw std::runtime_error(source + ": do_center_crop is not supported for " +
                             c.image_processor_type);
  if (c.do_center_crop && rescale_before_resize(c))
    throw std::runtime_error(source + ": do_center_crop is not supported for " +
                             c.image_processor_type);
  if (c.do_center_crop && (c.crop_height <= 0 || c.crop_width <= 0))
    throw std::runtime_error(source + ": do_center_crop without a crop_size");
  if (j.contains("pad_size") && !j["pad_size"].is_null())
    throw std::runtime_error(source + ": pad_size is not supported (padding to the batch maximum)");
  if (c.do_resize && c.height <= 0 && c.shortest_edge <= 0)
    throw std::runtime_error(source + ": do_resize without a size");
  // YolosImageProcessor.resize takes {shortest_edge, longest_edge} or {height, width} only.
  if (c.yolos_resize && c.do_resize && c.height <= 0 && c.longest_edge <= 0)
    throw std::runtime_error(source + ": " + c.image_processor_type +
                             " needs size.longest_edge with size.shortest_edge");
  if (c.do_rescale && !(c.rescale_factor > 0))
    throw std::runtime_error(source + ": rescale_factor must be positive");
  for (float s : c.image_std)
    if (c.do_normalize && s == 0.f) throw std::runtime_error(source + ": image_std has a zero");
  return c;
}

ProcessorConfig ProcessorConfig::from_file(const std::string& path) {
  // The same size cap as config.json (models::core::kMaxJsonFileBytes).
  return from_json(models::core::read_json_text(path), path);
}

std::pair<int64_t, int64_t> size_with_aspect_ratio(int64_t height, int64_t width,
                                                   int64_t shortest_edge, int64_t longest_edge) {
  int64_t size = shortest_edge;
  double raw_size = 0;
  bool have_raw = false;
  if (longest_edge > 0) {
    const double min_original = static_cast<double>(std::min(height, width));
    const double max_original = static_cast<double>(std::max(height, width));
    if (max_original / min_original * static_cast<double>(size) >
        static_cast<double>(longest_edge)) {
      raw_size = static_cast<double>(longest_edge) * min_original / max_original;
      size = py_round(raw_size);
      have_raw = true;
    }
  }
  if ((height <= width && height == size) || (width <= height && width == size))
    return {height, width};
  // The long side capped at longest_edge leaves the short side at half a pixel or less (rounded
  // half to even: 0) for an image at least 2 * longest_edge times longer than wide;
  // transformers' resize fails on it too.
  // c10::ValueError: the server answers an image's own size as INVALID_ARGUMENT
  // (server/core/infer_pipeline.cpp), with this message instead of ATen's.
  TORCH_CHECK_VALUE(size > 0, "ImageProcessor: an image of height ", height, " and width ", width,
                    " resizes to a short side of 0 pixels (shortest_edge ", shortest_edge,
                    ", longest_edge ", longest_edge, "): its aspect ratio is too extreme");
  if (width < height) {
    const int64_t oh = have_raw ? py_int(raw_size * static_cast<double>(height) / width)
                                : py_int(static_cast<double>(size) * height / width);
    return {oh, size};
  }
  const int64_t ow = have_raw ? py_int(raw_size * static_cast<double>(width) / height)
                              : py_int(static_cast<double>(size) * width / height);
  return {size, ow};
}

std::pair<int64_t, int64_t> size_with_aspect_ratio_yolos(int64_t height, int64_t width,
                                                         int64_t shortest_edge,
                                                         int64_t longest_edge) {
  int64_t size = shortest_edge;
  double raw_size = 0;
  bool have_raw = false;
  if (longest_edge > 0) {
    const double min_original = static_cast<double>(std::min(height, width));
    const double max_original = static_cast<double>(std::max(height, width));
    if (max_original / min_original * static_cast<double>(size) >
        static_cast<double>(longest_edge)) {
      raw_size = static_cast<double>(longest_edge) * min_original / max_original;
      size = py_round(raw_size);
      have_raw = true;
    }
  }
  int64_t oh = 0, ow = 0;
  if (width < height) {
    ow = size;
    oh = have_raw ? py_int(raw_size * static_cast<double>(height) / width)
                  : py_int(static_cast<double>(size) * height / width);
  } else if ((height <= width && height == size) || (width <= height && width == size)) {
    oh = height;
    ow = width;
  } else {
    oh = size;
    ow = have_raw ? py_int(raw_size * static_cast<double>(width) / height)
                  : py_int(static_cast<double>(size) * width / height);
  }
  constexpr int64_t kMod = 16;  // mod_size
  oh -= oh % kMod;
  ow -= ow % kMod;
  // c10::ValueError: the server answers an image's own size as INVALID_ARGUMENT
  // (server/core/infer_pipeline.cpp).
  TORCH_CHECK_VALUE(oh > 0 && ow > 0, "YolosImageProcessor: a ", height, "x", width,
                    " image resizes to ", oh, "x", ow, " (sides floored to multiples of 16)");
  return {oh, ow};
}

ImageProcessor::ImageProcessor(ProcessorConfig config) : config_(std::move(config)) {}

std::pair<int64_t, int64_t> ImageProcessor::output_size(int64_t height, int64_t width) const {
  if (config_.do_center_crop) return {config_.crop_height, config_.crop_width};
  return resized_size(config_, height, width);
}

at::Tensor ImageProcessor::resize(const at::Tensor& image_u8) const {
  TORCH_CHECK_VALUE(
      image_u8.dim() == 3 && image_u8.size(0) == 3 && image_u8.scalar_type() == at::kByte,
      "resize expects a (3, H, W) uint8 image, got ", image_u8.sizes(), " ",
      image_u8.scalar_type());
  const auto [oh, ow] = resized_size(config_, image_u8.size(1), image_u8.size(2));
  if (!config_.do_resize) return image_u8.contiguous();
  // On the CPU every resize kernel takes to_chw_tensor's interleaved view as it is (the native
  // uint8 antialiased one reads it faster than planes; tests/unit/image_processor_test.cpp checks
  // each kernel's values against planes); a CUDA image gets the planes its kernels had.
  at::Tensor x = (image_u8.is_cpu() ? image_u8 : image_u8.contiguous()).unsqueeze(0);
  const std::vector<int64_t> out{oh, ow};
  at::Tensor y;
  switch (config_.resample) {
    case 0:  // NEAREST: torchvision interpolates uint8 directly, no antialias
      y = at::upsample_nearest2d(x, out);
      break;
    case 3:  // BICUBIC: native uint8 on CPU
      if (!config_.antialias) {
        // torchvision resize(antialias=False): ATen's plain bicubic kernel (uint8 on CPU; on
        // CUDA float32 then clamp and round, as for the antialiased kernel below).
        y = x.is_cpu() ? at::upsample_bicubic2d(x, out, /*align_corners=*/false)
                       : at::upsample_bicubic2d(x.to(at::kFloat), out, false)
                             .clamp_(0, 255)
                             .round_()
                             .to(at::kByte);
      } else if (x.is_cpu()) {
        y = at::_upsample_bicubic2d_aa(x, out, /*align_corners=*/false);
      } else {
        // ATen's CUDA kernel has no uint8: float32, then torchvision's clamp and round
        // (transforms/v2/functional/_geometry.py resize_image, the non-native uint8 path).
        y = at::_upsample_bicubic2d_aa(x.to(at::kFloat), out, false)
                .clamp_(0, 255)
                .round_()
                .to(at::kByte);
      }
      break;
    default:
      const bool native =
          config_.uint8_resize == ProcessorConfig::Uint8Resize::native_uint8 ||
          (config_.uint8_resize == ProcessorConfig::Uint8Resize::automatic && x.is_cpu());
      if (!config_.antialias) {  // resize(antialias=False): ATen's plain bilinear kernel
        y = native ? at::upsample_bilinear2d(x, out, /*align_corners=*/false)
                   : at::upsample_bilinear2d(x.to(at::kFloat), out, false).round_().to(at::kByte);
      } else if (native) {
        y = at::_upsample_bilinear2d_aa(x, out, /*align_corners=*/false);
      } else {
        y = at::_upsample_bilinear2d_aa(x.to(at::kFloat), out, false).round_().to(at::kByte);
      }
  }
  // Contiguous planes whatever the input's layout (to_chw_tensor's is interleaved).
  return y.squeeze(0).contiguous();
}

at::Tensor ImageProcessor::center_crop(const at::Tensor& image_u8) const {
  TORCH_CHECK_VALUE(image_u8.dim() == 3 && image_u8.size(0) == 3,
                    "center_crop expects a (3, H, W) image, got ", image_u8.sizes());
  if (!config_.do_center_crop) return image_u8;
  const int64_t ch = config_.crop_height, cw = config_.crop_width;
  at::Tensor x = image_u8;
  int64_t h = x.size(1), w = x.size(2);
  if (cw > w || ch > h) {
    // tvF.pad(image, [left, top, right, bottom], fill=0)
    const int64_t left = cw > w ? (cw - w) / 2 : 0, right = cw > w ? (cw - w + 1) / 2 : 0;
    const int64_t top = ch > h ? (ch - h) / 2 : 0, bottom = ch > h ? (ch - h + 1) / 2 : 0;
    x = at::constant_pad_nd(x, {left, right, top, bottom}, 0);
    h = x.size(1);
    w = x.size(2);
    if (h == ch && w == cw) return x;
  }
  // int((image_height - crop_height) / 2.0): both non-negative here, so floor division.
  const int64_t crop_top = (h - ch) / 2, crop_left = (w - cw) / 2;
  return x.slice(1, crop_top, crop_top + ch).slice(2, crop_left, crop_left + cw).contiguous();
}

at::Tensor ImageProcessor::rescale_normalize(const at::Tensor& pixel_u8) const {
  at::Tensor x = pixel_u8.to(at::kFloat);
  const auto& c = config_;
  if (c.do_normalize) {
    // The fused mean and std, then tvF.normalize: x.sub_(mean).div_(std).
    const auto [m, s] = fused_mean_std(c);
    auto mean = at::tensor(std::vector<float>(m.begin(), m.end())).view({3, 1, 1});
    auto std_ = at::tensor(std::vector<float>(s.begin(), s.end())).view({3, 1, 1});
    x.sub_(mean.to(x.device())).div_(std_.to(x.device()));
  } else if (c.do_rescale) {
    x.mul_(static_cast<float>(c.rescale_factor));
  }
  return x;
}

namespace {

/// RfDetrImageProcessor's pixel_values of one (3, H, W) uint8 image: float32(u8) *
/// float32(rescale_factor) (do_rescale), resized like ImageProcessor::resize but on float32
/// (at::_upsample_bilinear2d_aa / _upsample_bicubic2d_aa, nearest without antialias;
/// do_resize), then (x - mean) / std (do_normalize). (3, H', W') float32.
at::Tensor rescale_resize_normalize(const ProcessorConfig& c, const at::Tensor& image_u8) {
  // RfDetrImageProcessor._preprocess: `image * rescale_factor` (uint8 tensor times a Python
  // float: float32 math), resize, tvF.normalize.
  at::Tensor x = image_u8.contiguous().to(at::kFloat);  // planes, as ATen's float kernels had
  if (c.do_rescale) x = x * static_cast<float>(c.rescale_factor);
  if (c.do_resize) {
    const auto [oh, ow] = resized_size(c, image_u8.size(1), image_u8.size(2));
    const std::vector<int64_t> out{oh, ow};
    x = x.unsqueeze(0);
    if (c.resample == 0)
      x = at::upsample_nearest2d(x, out);
    else if (c.resample == 3)
      x = at::_upsample_bicubic2d_aa(x, out, /*align_corners=*/false);
    else
      x = at::_upsample_bilinear2d_aa(x, out, /*align_corners=*/false);
    x = x.squeeze(0);
  }
  if (c.do_normalize) {
    const auto mean =
        at::tensor(std::vector<float>(c.image_mean.begin(), c.image_mean.end())).view({3, 1, 1});
    const auto std_ =
        at::tensor(std::vector<float>(c.image_std.begin(), c.image_std.end())).view({3, 1, 1});
    x = (x - mean.to(x.device())) / std_.to(x.device());
  }
  return x.contiguous();
}

}  // namespace

ProcessorOutput ImageProcessor::preprocess(const std::vector<at::Tensor>& images) const {
  if (images.empty()) throw std::invalid_argument("preprocess: empty batch");
  if (config_.owlv2) return preprocess_owlv2(images);
  ProcessorOutput out;
  std::vector<at::Tensor> resized;
  resized.reserve(images.size());
  int64_t max_h = 0, max_w = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& im = images[i];
    if (!im.defined() || im.dim() != 3 || im.size(0) != 3 || im.scalar_type() != at::kByte) {
      std::ostringstream s;
      s << "preprocess: image " << i << " must be a (3, H, W) uint8 tensor, got "
        << (im.defined() ? c10::str(im.sizes(), " ", im.scalar_type()) : "undefined");
      throw std::invalid_argument(s.str());
    }
    if (im.size(1) == 0 || im.size(2) == 0)
      throw std::invalid_argument(c10::str("preprocess: image ", i, " is empty ", im.sizes()));
    out.original_sizes.emplace_back(im.size(1), im.size(2));
    // On the image's device: a CUDA image (the image_decode slot's nvjpeg) is resized there.
    resized.push_back(center_crop(resize(im)));
    max_h = std::max(max_h, resized.back().size(1));
    max_w = std::max(max_w, resized.back().size(2));
  }
  const int64_t b = static_cast<int64_t>(images.size());
  if (!config_.do_pad) {
    for (size_t i = 1; i < resized.size(); ++i) {
      if (resized[i].sizes() != resized[0].sizes())
        throw std::invalid_argument(c10::str("preprocess: image ", i, " resizes to ",
                                             resized[i].sizes(), " but image 0 to ",
                                             resized[0].sizes(), " and do_pad is off"));
    }
    out.pixel_u8 = at::stack(resized);
    if (rescale_before_resize(config_)) {
      std::vector<at::Tensor> values;
      for (const auto& im : images) values.push_back(rescale_resize_normalize(config_, im));
      out.pixel_values = at::stack(values);
    } else {
      out.pixel_values = rescale_normalize(out.pixel_u8);
    }
    return out;
  }
  const auto on = at::TensorOptions().device(images[0].device());
  out.pixel_u8 = at::zeros({b, 3, max_h, max_w}, on.dtype(at::kByte));
  out.pixel_values = at::zeros({b, 3, max_h, max_w}, on.dtype(at::kFloat));
  out.pixel_mask = at::zeros({b, max_h, max_w}, on.dtype(at::kLong));
  for (int64_t i = 0; i < b; ++i) {
    const at::Tensor& r = resized[i];
    const int64_t h = r.size(1), w = r.size(2);
    using at::indexing::Slice;
    out.pixel_u8[i].index({Slice(), Slice(0, h), Slice(0, w)}).copy_(r);
    out.pixel_values[i]
        .index({Slice(), Slice(0, h), Slice(0, w)})
        .copy_(rescale_before_resize(config_) ? rescale_resize_normalize(config_, images[i])
                                              : rescale_normalize(r));
    out.pixel_mask[i].index({Slice(0, h), Slice(0, w)}).fill_(1);
  }
  return out;
}

ProcessorOutput ImageProcessor::preprocess_owlv2(const std::vector<at::Tensor>& images) const {
  ProcessorOutput out;
  std::vector<at::Tensor> values;
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& im = images[i];
    if (!im.defined() || im.dim() != 3 || im.size(0) != 3 || im.scalar_type() != at::kByte ||
        im.size(1) == 0 || im.size(2) == 0)
      throw std::invalid_argument(
          c10::str("preprocess: image ", i, " must be a non-empty (3, H, W) uint8 tensor, got ",
                   im.defined() ? c10::str(im.sizes(), " ", im.scalar_type()) : "undefined"));
    out.original_sizes.emplace_back(im.size(1), im.size(2));
    values.push_back(owlv2_pixel_values(config_, im));
    if (values.back().sizes() != values.front().sizes())
      throw std::invalid_argument(c10::str("preprocess: image ", i, " processes to ",
                                           values.back().sizes(), " but image 0 to ",
                                           values.front().sizes(), " (do_resize is off)"));
  }
  out.pixel_values = at::stack(values);
  // For display only: the normalisation undone, rounded to uint8.
  const auto mean =
      at::tensor(std::vector<float>(config_.image_mean.begin(), config_.image_mean.end()))
          .view({1, 3, 1, 1})
          .to(out.pixel_values.device());
  const auto std_ =
      at::tensor(std::vector<float>(config_.image_std.begin(), config_.image_std.end()))
          .view({1, 3, 1, 1})
          .to(out.pixel_values.device());
  auto unit = config_.do_normalize ? out.pixel_values * std_ + mean : out.pixel_values;
  if (!config_.do_rescale) unit = unit / 255.0;
  out.pixel_u8 = (unit * 255.0).round().clamp(0, 255).to(at::kByte);
  return out;
}

at::Tensor to_chw_tensor(const RgbImage& image) {
  at::Tensor hwc = at::empty({image.height, image.width, 3}, at::kByte);
  std::memcpy(hwc.data_ptr<uint8_t>(), image.rgb.data(), image.rgb.size());
  return hwc.permute({2, 0, 1});
}

at::Tensor decode_image(const uint8_t* data, size_t size, const DecodeOptions& options) {
  return to_chw_tensor(decode_rgb(data, size, options));
}

at::Tensor decode_image_file(const std::string& path, const DecodeOptions& options) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  try {
    return decode_image(bytes.data(), bytes.size(), options);
  } catch (const ImageError& e) {
    throw ImageError(path + ": " + e.what());
  }
}

std::unique_ptr<ImageProcessor> load_image_processor(const std::string& dir) {
  // Read with the cap and parsed once for the clipped error first: from_json would quote a
  // huge token whole.
  const std::string path = dir + "/preprocessor_config.json";
  const std::string text = models::core::read_json_text(path);
  (void)models::core::parse_json_text(text, path);
  return std::make_unique<ImageProcessor>(ProcessorConfig::from_json(text, path));
}

}  // namespace libreyolo::image
