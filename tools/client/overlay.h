// The picture `libreyolo-client segment --out FILE` writes: the image with each instance's mask
// painted over it in its own colour, for a person to look at. No torch, no gRPC.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace libreyolo::client {

/// `image` (JPEG/PNG bytes, decoded as the daemon decodes: EXIF orientation applied) with the
/// masks (k planes of h x w bytes, nonzero = inside; k x h x w bytes from `masks`, a plane's
/// row stride `stride` >= w bytes, planes `plane_stride` bytes apart: the daemon's padded
/// [N,K,H,W] layout) blended at 50% in colours of a fixed palette, as PNG bytes. Pixels
/// outside h x w are left as they are. Throws std::runtime_error (image::ImageError for an
/// unreadable image) when the image cannot be decoded or the masks are larger than it.
std::vector<uint8_t> mask_overlay_png(const std::string& image, const uint8_t* masks, int64_t k,
                                      int64_t h, int64_t w, int64_t stride, int64_t plane_stride);

}  // namespace libreyolo::client
