#include "server/tasks/segmentation_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace libreyolo::server {
namespace {

const std::vector<std::string>& mask_outputs() {
  static const std::vector<std::string> names = {"masks", "rle_counts", "rle_size"};
  return names;
}

}  // namespace

SegmentationRequest parse_segmentation_request(const api::InferRequest& request,
                                               const RequestLimits& limits,
                                               double default_threshold, int64_t default_top_k) {
  SegmentationRequest r;
  static_cast<DetectorRequest&>(r) =
      parse_detector_request(request, limits, default_threshold, default_top_k, mask_outputs());
  bool rle = false;
  for (const auto& [key, value] : request.parameters) {
    if (key == "mask_threshold") {
      r.mask_threshold = finite_param(key, value);
    } else if (key == "mask_format") {
      const auto* s = std::get_if<std::string>(&value);
      if (!s)
        invalid_argument(
            std::string("parameter 'mask_format' must be \"binary\" or \"rle\", got a ") +
            param_type_name(value));
      if (*s != "binary" && *s != "rle")
        invalid_argument("parameter 'mask_format' must be \"binary\" or \"rle\", got \"" +
                         s->substr(0, 64) + "\"");
      rle = *s == "rle";
    }
  }
  // No requested outputs: the detector's defaults (filled in) plus the format's masks.
  if (request.requested_outputs.empty()) {
    if (rle) {
      r.outputs.insert({"rle_counts", "rle_size"});
    } else {
      r.outputs.insert("masks");
    }
  }
  return r;
}

std::vector<api::OutputTensor> segmentation_outputs(
    const std::vector<image::InstanceMasks>& instances, const at::Tensor& logits,
    const at::Tensor& pred_boxes, const std::map<int64_t, std::string>& id2label,
    const std::set<std::string>& outputs) {
  std::vector<image::Detections> detections;
  detections.reserve(instances.size());
  for (const auto& i : instances) detections.push_back(i.detections);
  auto out = detector_outputs(detections, logits, pred_boxes, id2label, outputs);
  const int64_t n = static_cast<int64_t>(instances.size());
  // H x W over the images that have instances: an image without any adds no plane to pad.
  int64_t k = 0, h = 0, w = 0;
  for (const auto& i : instances) {
    if (i.masks.size(0) == 0) continue;
    k = std::max(k, i.masks.size(0));
    h = std::max(h, i.masks.size(1));
    w = std::max(w, i.masks.size(2));
  }
  const auto too_large = [](const std::string& what, double bytes) {
    throw api::Error(api::Code::resource_exhausted,
                     c10::str(what, " would be ", static_cast<uint64_t>(bytes),
                              " bytes, above the limit of ", kMaxMaskBytes,
                              " (raise 'threshold', lower 'top_k' or ask smaller 'target_sizes')"));
  };
  if (outputs.count("masks")) {
    const double bytes = static_cast<double>(n) * k * h * w;
    if (bytes > static_cast<double>(kMaxMaskBytes))
      too_large(c10::str("masks [", n, ",", k, ",", h, ",", w, "]"), bytes);
    api::OutputTensor t{"masks", "UINT8", {n, k, h, w}, {}};
    t.data.assign(static_cast<std::size_t>(n * k * h * w), '\0');
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor m = instances[i].masks.to(at::kCPU, at::kByte).contiguous();
      const int64_t ki = m.size(0), hi = m.size(1), wi = m.size(2);
      const auto* src = m.data_ptr<uint8_t>();
      for (int64_t j = 0; j < ki; ++j)
        for (int64_t y = 0; y < hi; ++y)
          std::memcpy(t.data.data() + ((i * k + j) * h + y) * w, src + (j * hi + y) * wi, wi);
    }
    out.push_back(std::move(t));
  }
  if (outputs.count("rle_counts")) {
    std::vector<std::vector<int64_t>> counts(static_cast<std::size_t>(n * k));
    std::size_t c = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < instances[i].masks.size(0); ++j) {
        counts[i * k + j] = image::coco_rle_counts(instances[i].masks[j]);
        c = std::max(c, counts[i * k + j].size());
      }
    const double bytes = static_cast<double>(n) * k * static_cast<double>(c) * 8;
    if (bytes > static_cast<double>(kMaxMaskBytes))
      too_large(c10::str("rle_counts [", n, ",", k, ",", c, "]"), bytes);
    std::vector<int64_t> flat(static_cast<std::size_t>(n * k) * c, -1);
    for (std::size_t m = 0; m < counts.size(); ++m)
      std::copy(counts[m].begin(), counts[m].end(), flat.begin() + m * c);
    api::OutputTensor t{"rle_counts", "INT64", {n, k, static_cast<int64_t>(c)}, {}};
    append_raw(t.data, flat.data(), flat.size());
    out.push_back(std::move(t));
  }
  if (outputs.count("rle_size")) {
    std::vector<int64_t> sizes;
    for (const auto& i : instances) sizes.insert(sizes.end(), {i.masks.size(1), i.masks.size(2)});
    api::OutputTensor t{"rle_size", "INT64", {n, 2}, {}};
    append_raw(t.data, sizes.data(), sizes.size());
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<api::TensorMetadata> segmentation_output_metadata(int64_t num_queries,
                                                              int64_t num_labels) {
  auto m = detector_output_metadata(num_queries, num_labels);
  m.push_back({"masks", "UINT8", {-1, -1, -1, -1}});
  m.push_back({"rle_counts", "INT64", {-1, -1, -1}});
  m.push_back({"rle_size", "INT64", {-1, 2}});
  return m;
}

}  // namespace libreyolo::server
