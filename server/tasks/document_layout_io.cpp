#include "server/tasks/document_layout_io.h"

#include <algorithm>

#include "models/image/document_layout.h"
#include "server/tasks/detector_io.h"
#include "server/tasks/segmentation_io.h"

namespace libreyolo::server {
namespace {

class DocumentLayoutTask final : public TaskAdapter {
 public:
  DocumentLayoutTask(const models::ModelDescription& d, std::map<int64_t, std::string> labels,
                     const ServingConfig& serving)
      : description_(d),
        labels_(std::move(labels)),
        serving_(serving),
        masks_(d.head == image::DetectionHead::pp_doclayout) {}

  const char* name() const override { return "object_detection"; }
  bool uses_boxes() const override { return true; }
  bool uses_masks() const override { return masks_; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    static const std::vector<std::string> with_masks = {"reading_order", "masks", "rle_counts",
                                                        "rle_size"};
    static const std::vector<std::string> boxes_only = {"reading_order"};
    auto d = parse_detector_request(request, limits, serving_.threshold, serving_.top_k,
                                    masks_ ? with_masks : boxes_only);
    TaskRequest r;
    static_cast<ImageInputs&>(r) = std::move(d);
    r.target_sizes = std::move(d.target_sizes);
    r.post = d.post;
    r.outputs = std::move(d.outputs);
    if (request.requested_outputs.empty()) r.outputs.insert("reading_order");
    return r;
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& out,
                                         const TaskRequest& r) const override {
    const bool want_masks =
        r.outputs.count("masks") || r.outputs.count("rle_counts") || r.outputs.count("rle_size");
    const auto pages = image::post_process_document_layout(
        out.logits, out.pred_boxes, out.order_logits, want_masks ? out.pred_masks : at::Tensor(),
        r.target_sizes, r.post.threshold);
    std::vector<image::InstanceMasks> instances;
    int64_t k = 0;
    for (const auto& p : pages) {
      instances.push_back({p.detections, want_masks ? p.masks : at::Tensor()});
      k = std::max(k, p.order.size(0));
    }
    const bool raw = r.outputs.count("logits") || r.outputs.count("pred_boxes");
    const auto logits = raw ? out.logits.contiguous() : at::Tensor();
    const auto boxes = raw ? out.pred_boxes.contiguous() : at::Tensor();
    auto tensors = want_masks ? segmentation_outputs(instances, logits, boxes, labels_, r.outputs)
                              : detector_outputs(
                                    [&] {
                                      std::vector<image::Detections> d;
                                      for (const auto& p : pages) d.push_back(p.detections);
                                      return d;
                                    }(),
                                    logits, boxes, labels_, r.outputs);
    if (r.outputs.count("reading_order")) {
      const int64_t n = static_cast<int64_t>(pages.size());
      std::vector<int64_t> ranks(static_cast<std::size_t>(n * k), -1);
      for (int64_t i = 0; i < n; ++i) {
        const at::Tensor o = pages[i].order.to(at::kCPU, at::kLong).contiguous();
        std::copy(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel(), ranks.begin() + i * k);
      }
      api::OutputTensor t{"reading_order", "INT64", {n, k}, {}};
      append_raw(t.data, ranks.data(), ranks.size());
      tensors.push_back(std::move(t));
    }
    return tensors;
  }

  std::vector<api::TensorMetadata> input_metadata() const override {
    return detector_input_metadata();
  }
  std::vector<api::TensorMetadata> output_metadata() const override {
    auto m = masks_
                 ? segmentation_output_metadata(description_.num_queries, description_.num_labels)
                 : detector_output_metadata(description_.num_queries, description_.num_labels);
    m.push_back({"reading_order", "INT64", {-1, -1}});
    return m;
  }
  std::map<std::string, std::string> config_parameters() const override {
    return {{"threshold", std::to_string(serving_.threshold)}};
  }

 private:
  models::ModelDescription description_;
  std::map<int64_t, std::string> labels_;
  ServingConfig serving_;
  bool masks_;  ///< PP-DocLayoutV3 (its processor returns masks); V2 has none
};

}  // namespace

std::unique_ptr<TaskAdapter> make_document_layout_task(const models::ModelDescription& d,
                                                       std::map<int64_t, std::string> labels,
                                                       const ServingConfig& serving) {
  return std::make_unique<DocumentLayoutTask>(d, std::move(labels), serving);
}

}  // namespace libreyolo::server
