// The pictures `libreyolo-client segment --out FILE` and `detect --out FILE` write: the image with
// each instance's mask painted over it, or each detection's box drawn on it, in its own colour,
// for a person to look at. No torch, no gRPC.
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

/// `image` (JPEG/PNG bytes, decoded as mask_overlay_png does) with `k` boxes drawn as 3-pixel
/// rectangle outlines in the colours of the same palette (box j in colour `labels[j]` mod 10, so
/// that one class keeps one colour). `boxes` holds k x 4 floats x0, y0, x1, y1 in the image's
/// pixels (the daemon's `boxes` output); parts outside the image are clipped, and a box that is
/// not finite or lies wholly outside is skipped. Returns PNG bytes. Throws std::runtime_error
/// (image::ImageError for an unreadable image).
std::vector<uint8_t> box_overlay_png(const std::string& image, const float* boxes,
                                     const int64_t* labels, int64_t k);

/// box_overlay_png, each box j also captioned with `captions[j]` (an open-vocabulary detector's
/// phrase; k captions): white 6x10 ASCII text (font6x10.h; other bytes drawn as '?', at most 40
/// characters) on a bar of the box's colour, above the box's top-left corner (inside it when the
/// box touches the image's top), clipped to the image. Throws as box_overlay_png.
std::vector<uint8_t> box_overlay_png(const std::string& image, const float* boxes,
                                     const int64_t* labels, int64_t k,
                                     const std::vector<std::string>& captions);

/// `image` (decoded as mask_overlay_png does) with a panoptic segmentation map painted over it:
/// `segmentation` holds h x w segment ids (row stride `stride` >= w values: the daemon's padded
/// `segmentation` INT32 [N,H,W]); each id > 0 is blended at 50% in palette colour id mod 10,
/// 0 (no segment) and -1 (none found, padding) are left as they are, as are pixels outside
/// h x w. Returns PNG bytes. Throws std::runtime_error (image::ImageError for an unreadable
/// image) when the image cannot be decoded or the map is larger than it.
std::vector<uint8_t> panoptic_overlay_png(const std::string& image, const int32_t* segmentation,
                                          int64_t h, int64_t w, int64_t stride);

}  // namespace libreyolo::client
