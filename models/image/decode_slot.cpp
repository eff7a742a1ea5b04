#include "models/image/decode_slot.h"

#include "models/image/processor.h"

namespace libreyolo::image {
namespace {

kernels::Outcome<kernels::DecodedImage> reference_decode(const kernels::EncodedImage& in,
                                                         const kernels::ImageDecodeOptions& o) {
  DecodeOptions options;
  options.max_pixels = o.max_pixels;
  options.strict_jpeg = o.strict_jpeg;
  options.apply_orientation = false;  // the caller read it: o.orientation
  kernels::DecodedImage out;
  try {
    // Contiguous planes, as kernels/image/image_decode.h promises (to_chw_tensor's view is
    // interleaved; a CUDA consumer such as the image_preprocess kernel declines it).
    out.pixels =
        to_chw_tensor(apply_orientation(decode_rgb(in.data, in.size, options), o.orientation))
            .contiguous();
  } catch (const ImageError& e) {
    out.error = e.what();
  }
  return out;
}

// libreyolo_models registers the reference into the process's registry as it loads (like the
// families' FamilyRegistrar): the decoder lives here, one floor above kernels/.
const bool registered = [] {
  register_image_decode_reference(kernels::Registry::process_default());
  return true;
}();

}  // namespace

void register_image_decode_reference(kernels::Registry& registry) {
  registry.declare(kernels::kImageDecode);
  registry.register_impl(kernels::kImageDecode, kernels::kReference,
                         kernels::ImageDecodeImpl(&reference_decode));
}

at::Tensor decode_image(const kernels::ImageDecodeHandle& handle, const uint8_t* data,
                        std::size_t size, const DecodeOptions& options, int device_index) {
  if (!handle.empty()) {
    kernels::ImageDecodeOptions o;
    o.max_pixels = options.max_pixels;
    o.strict_jpeg = options.strict_jpeg;
    o.orientation = options.apply_orientation ? image_orientation(data, size) : 1;
    o.device_index = device_index;
    if (auto out = handle(kernels::EncodedImage{data, size}, o)) {
      if (!out->error.empty()) throw ImageError(out->error);
      return std::move(out->pixels);
    }
  }
  return decode_image(data, size, options).contiguous();  // as promised (decode_slot.h)
}

std::vector<kernels::DecodedImage> decode_images(const kernels::ImageDecodeBatchHandle& batch,
                                                 const kernels::ImageDecodeHandle& single,
                                                 const std::vector<kernels::EncodedImage>& images,
                                                 const DecodeOptions& options, int device_index) {
  std::vector<kernels::DecodedImage> out;
  if (!batch.empty() && !images.empty()) {
    kernels::ImageDecodeOptions o;
    o.max_pixels = options.max_pixels;
    o.strict_jpeg = options.strict_jpeg;
    o.device_index = device_index;
    std::vector<int> orientations;
    for (const auto& im : images)
      orientations.push_back(options.apply_orientation ? image_orientation(im.data, im.size) : 1);
    if (auto decoded = batch(images, orientations, o)) out = std::move(*decoded);
  }
  out.resize(images.size());
  for (std::size_t i = 0; i < images.size(); ++i) {
    if (out[i].pixels.defined() || !out[i].error.empty()) continue;
    try {
      out[i].pixels = decode_image(single, images[i].data, images[i].size, options, device_index);
    } catch (const ImageError& e) {
      out[i].error = e.what();
    }
  }
  return out;
}

}  // namespace libreyolo::image
