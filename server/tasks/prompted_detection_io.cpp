#include "server/tasks/prompted_detection_io.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "models/text/unicode.h"
#include "server/tasks/detector_io.h"

namespace libreyolo::server {
namespace {

const std::vector<std::string>& default_outputs() {
  static const std::vector<std::string> names = {"boxes", "scores", "labels", "num_detections"};
  return names;
}

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

/// The `text` input as N label lists (N = batch; one shared row is repeated).
std::vector<std::vector<std::string>> parse_text(const api::InputTensor& t, int64_t batch) {
  if (t.datatype != "BYTES")
    invalid_argument("input 'text': datatype " + t.datatype + ", expected BYTES");
  if (t.on_device()) invalid_argument("input 'text': must be in host memory");
  if (t.shape.empty() || t.shape.size() > 2 || (t.shape[0] != 1 && t.shape[0] != batch) ||
      (t.shape.size() == 2 && t.shape[1] < 1))
    invalid_argument(c10::str("input 'text': shape ", shape_str(t.shape), ", expected [1], [",
                              batch, "], [1,L] or [", batch, ",L] (one prompt per image or one ",
                              "shared by the batch)"));
  const auto elements = split_bytes(t);
  const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
  if (static_cast<int64_t>(elements.size()) != rows * cols)
    invalid_argument(c10::str("input 'text': shape ", shape_str(t.shape), " has ", rows * cols,
                              " elements but the BYTES data holds ", elements.size()));
  std::vector<std::vector<std::string>> labels(static_cast<size_t>(rows));
  for (size_t e = 0; e < elements.size(); ++e) {
    const auto text = elements[e];
    if (text.size() > kMaxPromptBytes)
      invalid_argument(c10::str("input 'text': element ", e, " has ", text.size(),
                                " bytes, more than the ", kMaxPromptBytes, " a prompt may have"));
    try {
      (void)models::text::decode_utf8(text);
    } catch (const std::invalid_argument& err) {
      invalid_argument(c10::str("input 'text': element ", e, " is not UTF-8 (", err.what(), ")"));
    }
    auto& row = labels[e / static_cast<size_t>(cols)];
    if (t.shape.size() == 2) {  // one label per element
      const auto label = trim(text);
      if (!label.empty()) row.emplace_back(label);
    } else {
      row = prompt_labels(text, e);
    }
  }
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i].empty())
      invalid_argument(c10::str("input 'text': prompt ", i,
                                " has no label (empty, or only '.' separators and spaces)"));
  if (rows == 1 && batch > 1) labels.resize(static_cast<size_t>(batch), labels[0]);
  return labels;
}

/// Open-vocabulary detection (the contract of prompted_detection_io.h).
class PromptedDetectionTask final : public TaskAdapter {
 public:
  PromptedDetectionTask(const models::ModelDescription& d, const models::PromptedDetector& detector)
      : description_(d), detector_(detector), defaults_(detector.default_thresholds()) {}

  const char* name() const override { return "zero_shot_object_detection"; }
  bool uses_boxes() const override { return true; }

  TaskRequest parse(const api::InferRequest& request, const RequestLimits& limits) const override {
    // The detector's inputs and outputs, `text` and `label_ids` besides; its parameters
    // `threshold` / `top_k` are read here instead (no top-k upstream).
    auto d = parse_detector_request(request, limits, defaults_.box_threshold, 0, {"label_ids"},
                                    {"text"});
    TaskRequest r;
    static_cast<ImageInputs&>(r) = std::move(d);
    r.target_sizes = std::move(d.target_sizes);
    r.prompt_thresholds = defaults_;
    std::string task;  // "" = the family's default
    for (const auto& [key, value] : request.parameters) {
      if (key == "box_threshold" || key == "threshold") {
        r.prompt_thresholds.box_threshold = finite_param(key, value);
      } else if (key == "text_threshold") {
        if (!detector_.uses_text_threshold())
          invalid_argument("parameter 'text_threshold': model_type " + description_.model_type +
                           " has no text threshold (box_threshold only)");
        r.prompt_thresholds.text_threshold = finite_param(key, value);
      } else if (key == "nms_threshold") {
        if (!detector_.uses_nms_threshold())
          invalid_argument("parameter 'nms_threshold': model_type " + description_.model_type +
                           " has no NMS threshold (omdet-turbo only)");
        const double t = finite_param(key, value);
        if (t < 0 || t > 1)
          invalid_argument(c10::str("parameter 'nms_threshold' must be in [0, 1], got ", t));
        r.prompt_thresholds.nms_threshold = t;
      } else if (key == "task") {
        if (!detector_.uses_task())
          invalid_argument("parameter 'task': model_type " + description_.model_type +
                           " takes no task sentence (omdet-turbo only)");
        task = task_param(value, r.task_truncated);
      }
    }
    r.tasks.assign(static_cast<size_t>(r.batch), task);
    const api::InputTensor* text = nullptr;
    for (const auto& t : request.inputs)
      if (t.name == "text") text = &t;
    if (!text)
      invalid_argument("input 'text' is required by an open-vocabulary detector (BYTES [1] or [" +
                       std::to_string(r.batch) + "]: \"a cat. a dog.\" or a JSON list of labels)");
    r.prompts = parse_text(*text, r.batch);
    for (size_t i = 0; i < r.prompts.size(); ++i)
      if (static_cast<int64_t>(r.prompts[i].size()) > detector_.max_labels())
        invalid_argument(c10::str("input 'text': prompt ", i, " has ", r.prompts[i].size(),
                                  " labels, more than the ", detector_.max_labels(),
                                  " this model takes per image"));
    std::vector<std::vector<bool>> cut;
    try {
      cut = detector_.truncation(r.prompts);
    } catch (const std::invalid_argument& e) {
      invalid_argument(std::string("input 'text': ") + e.what());
    }
    for (size_t i = 0; i < cut.size(); ++i)
      for (size_t j = 0; j < cut[i].size(); ++j)
        if (cut[i][j])
          r.truncated_labels += (r.truncated_labels.empty() ? "" : ",") + c10::str(i, ":", j);
    if (request.requested_outputs.empty()) {
      r.outputs.insert(default_outputs().begin(), default_outputs().end());
    } else {
      r.outputs = std::move(d.outputs);
      if (r.outputs.count("label_names"))
        invalid_argument(
            "unknown output 'label_names' (an open-vocabulary detector's `labels` "
            "are the label texts)");
    }
    return r;
  }

  /// The request parameter `task` (prompted_detection_io.h): UTF-8 text with a non-space
  /// character, at most kMaxPromptBytes bytes; `truncated` set when the tokenizer cuts it.
  /// Throws api::Error INVALID_ARGUMENT "parameter 'task' ..." naming the problem.
  std::string task_param(const api::Parameter& value, bool& truncated) const {
    const auto* s = std::get_if<std::string>(&value);
    if (!s)
      invalid_argument(std::string("parameter 'task' must be a string, got ") +
                       param_type_name(value));
    if (s->size() > kMaxPromptBytes)
      invalid_argument(c10::str("parameter 'task' has ", s->size(), " bytes, more than the ",
                                kMaxPromptBytes, " a prompt may have"));
    if (trim(*s).empty())
      invalid_argument(
          "parameter 'task' is empty (leave it out for the default \"Detect <labels>.\")");
    try {
      (void)models::text::decode_utf8(*s);
    } catch (const std::invalid_argument& err) {
      invalid_argument(std::string("parameter 'task' is not UTF-8 (") + err.what() + ")");
    }
    truncated = detector_.task_truncated(*s);
    return *s;
  }

  std::vector<api::OutputTensor> respond(const models::ModelOutput& rows,
                                         const TaskRequest& r) const override {
    models::PromptedOutput out;
    static_cast<models::ModelOutput&>(out) = rows;
    const auto dets = detector_.post_process(out, r.target_sizes, r.prompts, r.prompt_thresholds);
    const int64_t n = static_cast<int64_t>(dets.size());
    int64_t k = 0;
    for (const auto& d : dets) k = std::max<int64_t>(k, d.scores.size(0));
    // The detector's numeric outputs (its `labels` INT64 become `label_ids`), then the texts.
    std::vector<image::Detections> plain(dets.begin(), dets.end());
    std::set<std::string> numeric;
    for (const char* o : {"scores", "boxes", "num_detections", "logits", "pred_boxes"})
      if (r.outputs.count(o)) numeric.insert(o);
    if (r.outputs.count("label_ids")) numeric.insert("labels");
    auto outputs = detector_outputs(plain, rows.logits, rows.pred_boxes, {}, numeric);
    for (auto& o : outputs)
      if (o.name == "labels") o.name = "label_ids";
    if (r.outputs.count("labels")) {
      api::OutputTensor t{"labels", "BYTES", {n, k}, {}};
      for (const auto& d : dets) {
        for (int64_t j = 0; j < k; ++j) {
          const std::string& s =
              j < static_cast<int64_t>(d.phrases.size()) ? d.phrases[j] : std::string();
          const auto len = static_cast<std::uint32_t>(s.size());
          t.data.append(reinterpret_cast<const char*>(&len), 4);
          t.data.append(s);
        }
      }
      if (!r.truncated_labels.empty()) t.parameters["truncated_labels"] = r.truncated_labels;
      if (r.task_truncated) t.parameters["truncated_task"] = true;
      t.parameters["max_text_tokens"] = std::int64_t{detector_.max_text_length()};
      outputs.push_back(std::move(t));
    }
    return outputs;
  }

  std::vector<api::TensorMetadata> input_metadata() const override {
    auto in = detector_input_metadata();
    in.push_back({"text", "BYTES", {-1}});
    return in;
  }
  std::vector<api::TensorMetadata> output_metadata() const override {
    return {{"boxes", "FP32", {-1, -1, 4}},
            {"scores", "FP32", {-1, -1}},
            {"labels", "BYTES", {-1, -1}},
            {"num_detections", "INT32", {-1}},
            {"label_ids", "INT64", {-1, -1}, true},
            {"logits", "FP32", {-1, -1, -1}, true},
            {"pred_boxes", "FP32", {-1, -1, 4}, true}};
  }
  std::map<std::string, std::string> config_parameters() const override {
    std::map<std::string, std::string> p{
        {"box_threshold", c10::str(defaults_.box_threshold)},
        {"max_labels", c10::str(detector_.max_labels())},
        {"max_text_tokens", c10::str(detector_.max_text_length())}};
    if (detector_.uses_text_threshold()) p["text_threshold"] = c10::str(defaults_.text_threshold);
    if (detector_.uses_nms_threshold()) p["nms_threshold"] = c10::str(defaults_.nms_threshold);
    return p;
  }

 private:
  models::ModelDescription description_;
  const models::PromptedDetector& detector_;
  models::PromptThresholds defaults_;
};

}  // namespace

std::vector<std::string> prompt_labels(std::string_view prompt, std::size_t element) {
  std::vector<std::string> labels;
  const auto body = trim(prompt);
  if (!body.empty() && body.front() == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(body);
    } catch (const nlohmann::json::exception&) {
      invalid_argument(c10::str("input 'text': element ", element,
                                ": starts with '[' but is not a JSON array of strings"));
    }
    if (!j.is_array())
      invalid_argument(c10::str("input 'text': element ", element, ": not a JSON array"));
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_string())
        invalid_argument(
            c10::str("input 'text': element ", element, ": label ", i, " is not a string"));
      const auto label = trim(j[i].get_ref<const std::string&>());
      if (!label.empty()) labels.emplace_back(label);
    }
    return labels;
  }
  std::size_t at = 0;
  while (at <= body.size()) {
    const auto dot = body.find('.', at);
    const auto part = trim(body.substr(at, dot == std::string_view::npos ? body.npos : dot - at));
    if (!part.empty()) labels.emplace_back(part);
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  return labels;
}

std::unique_ptr<TaskAdapter> make_prompted_detection_task(const models::Model& model,
                                                          const models::PromptedDetector& detector,
                                                          const ServingConfig&) {
  return std::make_unique<PromptedDetectionTask>(model.description(), detector);
}

}  // namespace libreyolo::server
