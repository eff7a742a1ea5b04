#include "server/tasks/panoptic_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace libreyolo::server {
namespace {

const std::vector<std::string>& panoptic_only_outputs() {
  static const std::vector<std::string> names = {"segmentation",   "segments_info",
                                                 "num_segments",   "segment_ids",
                                                 "segment_labels", "segment_scores"};
  return names;
}

std::set<int64_t> label_ids_param(const api::Parameter& p) {
  if (const auto* i = std::get_if<int64_t>(&p)) return {*i};
  const auto* s = std::get_if<std::string>(&p);
  if (!s)
    invalid_argument(
        "parameter 'label_ids_to_fuse' must be class ids separated by commas, got a non-string");
  std::set<int64_t> ids;
  const auto bad = [&] {
    invalid_argument("parameter 'label_ids_to_fuse' must be class ids separated by commas, got \"" +
                     s->substr(0, 64) + "\"");
  };
  std::size_t start = 0;
  if (s->find_first_not_of(' ') == std::string::npos) return ids;  // "": none
  while (start <= s->size()) {
    const auto end = std::min(s->find(',', start), s->size());
    const auto item = s->substr(start, end - start);
    const auto first = item.find_first_not_of(' ');
    const auto last = item.find_last_not_of(' ');
    if (first == std::string::npos) bad();
    const auto digits = item.substr(first, last - first + 1);
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      bad();
    ids.insert(std::stoll(digits));
    start = end + 1;
  }
  return ids;
}

}  // namespace

bool panoptic_wants_detections(const std::set<std::string>& outputs) {
  for (const auto& o : detector_default_outputs())
    if (outputs.count(o)) return true;
  return false;
}

PanopticRequest parse_panoptic_request(const api::InferRequest& request,
                                       const RequestLimits& limits, double default_threshold,
                                       int64_t default_top_k) {
  PanopticRequest r;
  static_cast<DetectorRequest&>(r) = parse_detector_request(request, limits, default_threshold,
                                                            default_top_k, panoptic_only_outputs());
  r.panoptic.threshold = r.post.threshold;
  for (const auto& [key, value] : request.parameters) {
    if (key == "mask_threshold") {
      r.panoptic.mask_threshold = finite_param(key, value);
    } else if (key == "overlap_mask_area_threshold") {
      r.panoptic.overlap_mask_area_threshold = finite_param(key, value);
    } else if (key == "label_ids_to_fuse") {
      r.panoptic.label_ids_to_fuse = label_ids_param(value);
    }
  }
  if (request.requested_outputs.empty())
    r.outputs = {"segmentation", "segments_info", "num_segments"};
  return r;
}

std::vector<api::OutputTensor> panoptic_outputs(const std::vector<image::PanopticResult>& results,
                                                const std::vector<image::Detections>& detections,
                                                const at::Tensor& logits,
                                                const at::Tensor& pred_boxes,
                                                const std::map<int64_t, std::string>& id2label,
                                                const std::set<std::string>& outputs) {
  std::vector<api::OutputTensor> out;
  if (panoptic_wants_detections(outputs) || outputs.count("logits") || outputs.count("pred_boxes"))
    out = detector_outputs(detections, logits, pred_boxes, id2label, outputs);
  const int64_t n = static_cast<int64_t>(results.size());
  int64_t h = 0, w = 0, s = 0;
  for (const auto& r : results) {
    h = std::max(h, r.segmentation.size(0));
    w = std::max(w, r.segmentation.size(1));
    s = std::max(s, static_cast<int64_t>(r.segments.size()));
  }
  if (outputs.count("segmentation")) {
    api::OutputTensor t{"segmentation", "INT32", {n, h, w}, {}};
    std::vector<int32_t> map(static_cast<std::size_t>(n * h * w), -1);
    for (int64_t i = 0; i < n; ++i) {
      const auto m = results[i].segmentation.to(at::kCPU, at::kInt).contiguous();
      const int64_t hi = m.size(0), wi = m.size(1);
      for (int64_t y = 0; y < hi; ++y)
        std::memcpy(map.data() + (i * h + y) * w, m.data_ptr<int32_t>() + y * wi,
                    wi * sizeof(int32_t));
    }
    append_raw(t.data, map.data(), map.size());
    out.push_back(std::move(t));
  }
  if (outputs.count("segments_info")) {
    api::OutputTensor t{"segments_info", "BYTES", {n}, {}};
    for (const auto& r : results) {
      auto info = nlohmann::json::array();
      for (const auto& seg : r.segments)
        info.push_back({{"id", seg.id},
                        {"label_id", seg.label_id},
                        {"label", image::label_name(id2label, seg.label_id)},
                        {"was_fused", seg.was_fused},
                        {"score", seg.score}});
      const auto text = info.dump();
      const auto len = static_cast<std::uint32_t>(text.size());
      t.data.append(reinterpret_cast<const char*>(&len), 4);
      t.data.append(text);
    }
    out.push_back(std::move(t));
  }
  if (outputs.count("num_segments")) {
    std::vector<int32_t> counts;
    for (const auto& r : results) counts.push_back(static_cast<int32_t>(r.segments.size()));
    api::OutputTensor t{"num_segments", "INT32", {n}, {}};
    append_raw(t.data, counts.data(), counts.size());
    out.push_back(std::move(t));
  }
  std::vector<int32_t> ids(static_cast<std::size_t>(n * s), 0);
  std::vector<int64_t> labels(static_cast<std::size_t>(n * s), -1);
  std::vector<float> scores(static_cast<std::size_t>(n * s), 0.f);
  for (int64_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < results[i].segments.size(); ++j) {
      const auto& seg = results[i].segments[j];
      ids[i * s + j] = static_cast<int32_t>(seg.id);
      labels[i * s + j] = seg.label_id;
      scores[i * s + j] = static_cast<float>(seg.score);
    }
  if (outputs.count("segment_ids")) {
    out.push_back({"segment_ids", "INT32", {n, s}, {}});
    append_raw(out.back().data, ids.data(), ids.size());
  }
  if (outputs.count("segment_labels")) {
    out.push_back({"segment_labels", "INT64", {n, s}, {}});
    append_raw(out.back().data, labels.data(), labels.size());
  }
  if (outputs.count("segment_scores")) {
    out.push_back({"segment_scores", "FP32", {n, s}, {}});
    append_raw(out.back().data, scores.data(), scores.size());
  }
  return out;
}

std::vector<api::TensorMetadata> panoptic_output_metadata(int64_t num_queries, int64_t num_labels) {
  auto m = detector_output_metadata(num_queries, num_labels);
  m.push_back({"segmentation", "INT32", {-1, -1, -1}});
  m.push_back({"segments_info", "BYTES", {-1}});
  m.push_back({"num_segments", "INT32", {-1}});
  m.push_back({"segment_ids", "INT32", {-1, -1}});
  m.push_back({"segment_labels", "INT64", {-1, -1}});
  m.push_back({"segment_scores", "FP32", {-1, -1}});
  return m;
}

}  // namespace libreyolo::server
