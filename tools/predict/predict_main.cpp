// libreyolo-predict: runs one checkpoint folder on images (or on stored pixels) and prints the
// detections / classes, the kernel implementation of every slot, and optionally dumps results.
//
//   libreyolo-predict --model DIR (--image FILE ... | --pixels FILE.safetensors)
//   (DIR: a checkpoint folder, or a model folder <repo>/<model>: its highest numeric version)
//                     [--threshold T] [--top-k K] [--device cpu|cuda[:N]]
//                     [--dtype float32|float16|bfloat16] [--layouts default|on|off]
//                     [--out FILE.json|FILE.safetensors]
//                     [--prompt TEXT [--text-threshold T] [--task TEXT]]   (text-conditioned
//                     detectors; --task: OmDet-Turbo's task sentence)
// Exit codes: 0 ok, 1 runtime error (bad image, bad checkpoint, ...), 2 usage error.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/policy.h"
#include "log/log.h"
#include "models/core/safetensors.h"
#include "models/grounding_dino/grounding_dino.h"
#include "models/grounding_dino/postprocess.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/prompted.h"
#include "tools/predict/safetensors_write.h"

namespace {

namespace image = libreyolo::image;
namespace models = libreyolo::models;
using nlohmann::json;

const char* kUsage =
    "usage: libreyolo-predict --model DIR (--image FILE ... | --pixels FILE.safetensors)\n"
    "                         [--threshold T] [--top-k K] [--device cpu|cuda[:N]]\n"
    "                         [--dtype float32|float16|bfloat16] [--layouts default|on|off]\n"
    "                         [--out FILE.json|FILE.safetensors]\n"
    "                         [--prompt TEXT [--text-threshold T] [--task TEXT]]\n"
    "  --model DIR       checkpoint folder (config.json, model.safetensors, "
    "preprocessor_config.json),\n"
    "                    or a model folder of a model repository (DIR/<version>/...): its\n"
    "                    highest numeric version, as libreyolo-server serves it\n"
    "  --image FILE      JPEG or PNG; repeat for a batch\n"
    "  --pixels FILE     safetensors with pixel_values (float, processed) or pixel_u8 (uint8,\n"
    "                    resized; rescaled/normalised here), optional pixel_mask (B,H,W) and\n"
    "                    target_sizes (B,2) (H,W); default target size: the pixels' size\n"
    "                    (the pixel_mask's valid region when there is one)\n"
    "  --threshold T     keep detections with score > T (default 0.5)\n"
    "  --top-k K         detections: candidates before the threshold (default: the family's);\n"
    "                    classifiers: classes printed (default 5)\n"
    "  --device D        cpu (default), cuda, cuda:N\n"
    "  --dtype T         float32 (default), float16, bfloat16\n"
    "  --layouts M       default (the family's, or LIBREYOLO_LAYOUTS), on, off: which layouts\n"
    "                    (models/layouts/) rewrite the loaded model; printed on stderr\n"
    "  --out FILE        .json: the printed results; .safetensors: raw logits/pred_boxes,\n"
    "                    pixel_values and per-image img{i}_{scores,labels,boxes}\n"
    "  --prompt TEXT     text-conditioned detectors (Grounding DINO, MM Grounding DINO): the\n"
    "                    prompt of every image, \"a cat. a remote control.\"; --threshold is\n"
    "                    then the box threshold (a box is kept when its best token's\n"
    "                    probability is > T) and each box is named by its phrase\n"
    "                    OWL-ViT / OWLv2: the labels of every image, separated by '.'\n"
    "                    (\"a cat. a remote control.\" = two labels); each box is named by\n"
    "                    its best label (--threshold: its score > T)\n"
    "  --text-threshold T  tokens of a box's phrase: probability > T (default 0.25)\n"
    "  --task TEXT       OmDet-Turbo: the task sentence of every image (default \"Detect\n"
    "                    <labels joined by ', '>.\", as OmDetTurboProcessor makes it)\n"
    "Image sizes are printed width x height (WxH), as in error messages; boxes are\n"
    "[x0, y0, x1, y1] in pixels of the image as displayed (EXIF orientation applied).\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string model;
  std::vector<std::string> images;
  std::string pixels;
  double threshold = 0.5;
  int64_t top_k = 0;
  std::string device = "cpu";
  std::string dtype = "float32";
  std::string layouts;  ///< "" = not given (LIBREYOLO_LAYOUTS, else default)
  std::string out;
  std::string prompt;  ///< "" = none
  double text_threshold = 0.25;
  bool has_text_threshold = false;
  std::string task;  ///< "" = the family's default (OmDet-Turbo only)
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Args parse_args(int argc, char** argv) {
  Args a;
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    try {
      if (f == "--model") {
        a.model = value(i, f);
      } else if (f == "--image") {
        a.images.push_back(value(i, f));
      } else if (f == "--pixels") {
        a.pixels = value(i, f);
      } else if (f == "--threshold") {
        size_t pos = 0;
        const std::string v = value(i, f);
        a.threshold = std::stod(v, &pos);
        if (pos != v.size()) throw std::invalid_argument(v);
      } else if (f == "--top-k") {
        size_t pos = 0;
        const std::string v = value(i, f);
        a.top_k = std::stoll(v, &pos);
        if (pos != v.size() || a.top_k <= 0) throw std::invalid_argument(v);
      } else if (f == "--device") {
        a.device = value(i, f);
      } else if (f == "--dtype") {
        a.dtype = value(i, f);
      } else if (f == "--layouts") {
        a.layouts = value(i, f);
        if (a.layouts != "default" && a.layouts != "on" && a.layouts != "off")
          throw UsageError("--layouts must be default, on or off");
      } else if (f == "--out") {
        a.out = value(i, f);
      } else if (f == "--prompt") {
        a.prompt = value(i, f);
        if (a.prompt.empty()) throw UsageError("--prompt must not be empty");
      } else if (f == "--task") {
        a.task = value(i, f);
        if (a.task.empty()) throw UsageError("--task must not be empty");
      } else if (f == "--text-threshold") {
        size_t pos = 0;
        const std::string v = value(i, f);
        a.text_threshold = std::stod(v, &pos);
        a.has_text_threshold = true;
        if (pos != v.size()) throw std::invalid_argument(v);
      } else {
        throw UsageError("unknown argument '" + f + "'");
      }
    } catch (const std::invalid_argument&) {
      throw UsageError("invalid value for " + f);
    } catch (const std::out_of_range&) {
      throw UsageError("value out of range for " + f);
    }
  }
  if (a.model.empty()) throw UsageError("--model is required");
  if (a.images.empty() == a.pixels.empty())
    throw UsageError("give either --image (one or more) or --pixels");
  if (a.dtype != "float32" && a.dtype != "float16" && a.dtype != "bfloat16")
    throw UsageError("--dtype must be float32, float16 or bfloat16");
  if (a.device != "cpu" && a.device != "cuda" && a.device.rfind("cuda:", 0) != 0)
    throw UsageError("--device must be cpu, cuda or cuda:N");
  if (a.has_text_threshold && a.prompt.empty()) throw UsageError("--text-threshold needs --prompt");
  if (!a.task.empty() && a.prompt.empty()) throw UsageError("--task needs --prompt");
  if (!a.out.empty() && !ends_with(a.out, ".json") && !ends_with(a.out, ".safetensors"))
    throw UsageError("--out must end in .json or .safetensors");
  return a;
}

/// The checkpoint folder of `--model DIR`: DIR itself when it has a config.json, else its
/// highest numeric version folder DIR/<N> (digits, no leading zero: libreyolo-server's rule,
/// server/repository/model_name.h highest_version). Throws std::runtime_error naming DIR otherwise.
std::string checkpoint_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "config.json", ec)) return dir;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(dir + ": not a directory");
  std::string best;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.size() > 17 || name[0] == '0' ||
        name.find_first_not_of("0123456789") != std::string::npos || !e.is_directory(ec))
      continue;
    if (best.empty() || name.size() > best.size() || (name.size() == best.size() && name > best))
      best = name;
  }
  if (best.empty()) {
    throw std::runtime_error(dir +
                             ": no config.json and no numeric version folder (expected a "
                             "checkpoint folder, or a model folder DIR/<version>/)");
  }
  return (fs::path(dir) / best).string();
}

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "float16") return at::kHalf;
  if (dtype == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

struct Inputs {
  at::Tensor pixel_values;  // float32 (B,3,H,W), CPU
  at::Tensor pixel_mask;    // int64 (B,H,W) or undefined
  std::vector<std::pair<int64_t, int64_t>> target_sizes;
  std::vector<std::string> sources;
};

Inputs inputs_from_images(const Args& a) {
  const auto proc = image::load_image_processor(a.model);
  std::vector<at::Tensor> decoded;
  for (const auto& path : a.images) decoded.push_back(image::decode_image_file(path));
  auto out = proc->preprocess(decoded);
  return {out.pixel_values, out.pixel_mask, out.original_sizes, a.images};
}

Inputs inputs_from_pixels(const Args& a) {
  auto file = models::core::SafetensorsFile::open(a.pixels);
  Inputs in;
  if (file->contains("pixel_values")) {
    in.pixel_values = file->get("pixel_values", at::kFloat, at::kCPU);
  } else if (file->contains("pixel_u8")) {
    in.pixel_values =
        image::load_image_processor(a.model)->rescale_normalize(file->view("pixel_u8"));
  } else {
    throw std::runtime_error(a.pixels + ": no tensor 'pixel_values' or 'pixel_u8'");
  }
  if (in.pixel_values.dim() != 4 || in.pixel_values.size(1) != 3)
    throw std::runtime_error(
        c10::str(a.pixels, ": pixels must be (B, 3, H, W), got ", in.pixel_values.sizes()));
  const int64_t b = in.pixel_values.size(0);
  if (file->contains("pixel_mask")) {
    in.pixel_mask = file->get("pixel_mask", at::kLong, at::kCPU);
    in.pixel_values = in.pixel_values * in.pixel_mask.unsqueeze(1);  // padding is 0
  }
  if (file->contains("target_sizes")) {
    const at::Tensor ts = file->get("target_sizes", at::kLong, at::kCPU);
    if (ts.dim() != 2 || ts.size(0) != b || ts.size(1) != 2)
      throw std::runtime_error(a.pixels + ": target_sizes must be (B, 2)");
    for (int64_t i = 0; i < b; ++i)
      in.target_sizes.emplace_back(ts[i][0].item<int64_t>(), ts[i][1].item<int64_t>());
  } else if (in.pixel_mask.defined()) {  // the valid (unpadded) region
    for (int64_t i = 0; i < b; ++i) {
      const at::Tensor valid = in.pixel_mask[i].ne(0);
      in.target_sizes.emplace_back(valid.any(1).sum().item<int64_t>(),
                                   valid.any(0).sum().item<int64_t>());
    }
  } else {
    for (int64_t i = 0; i < b; ++i)
      in.target_sizes.emplace_back(in.pixel_values.size(2), in.pixel_values.size(3));
  }
  for (int64_t i = 0; i < b; ++i) in.sources.push_back(c10::str(a.pixels, "[", i, "]"));
  return in;
}

std::string fmt(double v, int precision) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

/// Prints "<source> (WxH): N detections with score > T" (WxH, the convention of every size in
/// messages; target_sizes themselves are (H, W)) and returns image i's JSON without detections.
json image_result(const Inputs& in, size_t i, int64_t count, double threshold) {
  std::cout << in.sources[i] << " (" << in.target_sizes[i].second << "x" << in.target_sizes[i].first
            << "): " << count << " detections with score > " << threshold << "\n";
  return {{"source", in.sources[i]},
          {"height", in.target_sizes[i].first},
          {"width", in.target_sizes[i].second},
          {"detections", json::array()}};
}

/// Prints one detection line (name, score, [x0, y0, x1, y1]); returns the box as floats.
std::vector<float> print_detection(const std::string& name, float score, const at::Tensor& box) {
  std::vector<float> b(4);
  for (int j = 0; j < 4; ++j) b[j] = box[j].item<float>();
  std::cout << "  " << std::left << std::setw(16) << name << std::right << " " << fmt(score, 4)
            << "  [" << fmt(b[0], 1) << ", " << fmt(b[1], 1) << ", " << fmt(b[2], 1) << ", "
            << fmt(b[3], 1) << "]\n";
  return b;
}

int run(Args a) {
  if (const std::string folder = checkpoint_folder(a.model); folder != a.model) {
    std::cout << "model " << a.model << ": highest version " << folder << "\n";
    a.model = folder;
  }
  const auto env = libreyolo::kernels::process_environment();
  const auto policy = libreyolo::kernels::policy_from_environment(env);
  libreyolo::kernels::initialize(policy);

  models::LoadOptions options;
  options.dtype = scalar_type(a.dtype);
  options.device = at::Device(a.device);
  options.layouts.mode = policy.layouts;  // LIBREYOLO_LAYOUTS, else default
  if (!a.layouts.empty()) {
    using libreyolo::kernels::LayoutMode;
    options.layouts.mode = {a.layouts == "on"    ? LayoutMode::on
                            : a.layouts == "off" ? LayoutMode::off
                                                 : LayoutMode::family_default,
                            libreyolo::kernels::Source::flag, "--layouts"};
  }
  const auto model = models::load_model(a.model, options);
  const auto& mode = options.layouts.mode;
  std::cerr << "layouts " << libreyolo::kernels::layout_mode_name(mode.value) << " ("
            << libreyolo::kernels::source_name(mode.source)
            << (mode.origin.empty() ? "" : " " + mode.origin) << "):\n"
            << models::layouts::describe(model->layouts());

  const Inputs in = a.images.empty() ? inputs_from_pixels(a) : inputs_from_images(a);
  const auto* text_model =
      dynamic_cast<const models::grounding_dino::TextConditioned*>(model.get());
  // The other open-vocabulary families (OWL-ViT, OWLv2): labels, one list for every image.
  const auto* labelled = text_model == nullptr ? models::prompted_detector(*model) : nullptr;
  if ((text_model != nullptr || labelled != nullptr) && a.prompt.empty())
    throw std::runtime_error(model->model_type() + " is text-conditioned: give --prompt");
  if (text_model == nullptr && labelled == nullptr && !a.prompt.empty())
    throw std::runtime_error(model->model_type() + " takes no --prompt");
  if (!a.task.empty() && (labelled == nullptr || !labelled->uses_task()))
    throw std::runtime_error(model->model_type() + " takes no --task");
  models::PromptedOutput raw;
  models::grounding_dino::TextTensors text;
  std::vector<std::vector<std::string>> labels;  // OWL: each image's labels
  {
    c10::InferenceMode guard;
    const at::Tensor pv = in.pixel_values.to(options.device, options.dtype);
    const at::Tensor pm = in.pixel_mask.defined() ? in.pixel_mask.to(options.device) : at::Tensor();
    if (text_model != nullptr) {
      text = models::grounding_dino::encode_prompts(
          text_model->tokenizer(),
          std::vector<std::string>(static_cast<size_t>(pv.size(0)), a.prompt));
      static_cast<models::ModelOutput&>(raw) = text_model->forward_text(pv, pm, text);
    } else if (labelled != nullptr) {
      labels.assign(static_cast<size_t>(pv.size(0)), models::split_labels(a.prompt));
      const auto queries =
          labelled->encode_with_tasks(labels, std::vector<std::string>(labels.size(), a.task));
      text.input_ids = queries.input_ids.to(at::kCPU);
      raw = labelled->forward_prompted_masked(pv, pm, queries);
    } else {
      static_cast<models::ModelOutput&>(raw) = model->forward(pv, pm);
    }
  }
  const at::Tensor logits = raw.logits.to(at::kCPU, at::kFloat);

  json result;
  result["model"] = a.model;
  result["model_type"] = model->model_type();
  result["device"] = a.device;
  result["dtype"] = a.dtype;
  result["layouts"] = {{"mode", libreyolo::kernels::layout_mode_name(mode.value)},
                       {"source", libreyolo::kernels::source_name(mode.source)},
                       {"applied", json::array()}};
  for (const auto& r : model->layouts())
    result["layouts"]["applied"].push_back({{"layout", r.layout},
                                            {"source", r.source},
                                            {"classes", r.classes},
                                            {"modules_replaced", r.modules},
                                            {"params_before", r.params_before},
                                            {"params_after", r.params_after}});
  std::map<std::string, at::Tensor> dump = {{"logits", logits}, {"pixel_values", in.pixel_values}};
  if (in.pixel_mask.defined()) dump["pixel_mask"] = in.pixel_mask;

  if (labelled != nullptr) {
    // The family's post-processing: boxes named by their best label.
    result["task"] = "zero-shot-object-detection";
    result["prompt"] = a.prompt;
    dump["pred_boxes"] = raw.pred_boxes.to(at::kCPU, at::kFloat);
    dump["input_ids"] = text.input_ids;
    if (raw.objectness_logits.defined())
      dump["objectness_logits"] = raw.objectness_logits.to(at::kCPU, at::kFloat);
    const auto dets = labelled->post_process(raw, in.target_sizes, labels, {a.threshold, 0.0});
    for (size_t i = 0; i < dets.size(); ++i) {
      const auto& d = dets[i];
      json ji = image_result(in, i, d.scores.numel(), a.threshold);
      for (int64_t k = 0; k < d.scores.numel(); ++k) {
        const float score = d.scores[k].item<float>();
        const std::string& label = d.phrases[static_cast<size_t>(k)];
        const auto box = print_detection(label, score, d.boxes[k]);
        ji["detections"].push_back({{"label", d.labels[k].item<int64_t>()},
                                    {"name", label},
                                    {"score", score},
                                    {"box", box}});
      }
      result["images"].push_back(ji);
      const std::string key = "img" + std::to_string(i) + "_";
      dump[key + "scores"] = d.scores;
      dump[key + "labels"] = d.labels;
      dump[key + "boxes"] = d.boxes;
    }
  } else if (text_model != nullptr) {
    // post_process_grounded_object_detection: boxes named by the phrase of their tokens.
    result["task"] = "zero-shot-object-detection";
    result["prompt"] = a.prompt;
    const at::Tensor boxes = raw.pred_boxes.to(at::kCPU, at::kFloat);
    dump["pred_boxes"] = boxes;
    dump["input_ids"] = text.input_ids;
    const auto dets = models::grounding_dino::post_process_grounded_object_detection(
        logits, boxes, text.input_ids, a.threshold, a.text_threshold, in.target_sizes,
        text_model->tokenizer());
    for (size_t i = 0; i < dets.size(); ++i) {
      const auto& d = dets[i];
      json ji = image_result(in, i, d.scores.numel(), a.threshold);
      for (int64_t k = 0; k < d.scores.numel(); ++k) {
        const float score = d.scores[k].item<float>();
        const std::string& phrase = d.phrases[static_cast<size_t>(k)];
        const auto box = print_detection(phrase, score, d.boxes[k]);
        ji["detections"].push_back({{"phrase", phrase}, {"score", score}, {"box", box}});
      }
      result["images"].push_back(ji);
      const std::string key = "img" + std::to_string(i) + "_";
      dump[key + "scores"] = d.scores;
      dump[key + "boxes"] = d.boxes;
    }
  } else if (model->task() == models::Task::object_detection ||
             model->task() == models::Task::instance_segmentation ||
             model->task() == models::Task::panoptic_segmentation) {
    // Instance and panoptic segmentation: their detections (the same queries' boxes), and the
    // raw pred_masks in the --out dump.
    const bool panoptic = model->task() == models::Task::panoptic_segmentation;
    const bool segmentation = panoptic || model->task() == models::Task::instance_segmentation;
    result["task"] = panoptic       ? "panoptic-segmentation"
                     : segmentation ? "instance-segmentation"
                                    : "object-detection";
    const at::Tensor boxes = raw.pred_boxes.to(at::kCPU, at::kFloat);
    dump["pred_boxes"] = boxes;
    if (segmentation) dump["pred_masks"] = raw.pred_masks.to(at::kCPU, at::kFloat);
    // Document layout: the reading-order logits (PP-DocLayoutV2, V3) and V3's mask logits.
    if (raw.order_logits.defined()) {
      if (raw.pred_masks.defined()) dump["out_masks"] = raw.pred_masks.to(at::kCPU, at::kFloat);
      dump["order_logits"] = raw.order_logits.to(at::kCPU, at::kFloat);
    }
    image::PostProcessOptions post;
    post.threshold = a.threshold;
    post.top_k = a.top_k;
    post.use_focal_loss = model->description().use_focal_loss;
    const auto dets = image::post_process_object_detection(logits, boxes, in.target_sizes,
                                                           model->description().head, post);
    for (size_t i = 0; i < dets.size(); ++i) {
      const auto& d = dets[i];
      json ji = image_result(in, i, d.scores.numel(), a.threshold);
      for (int64_t k = 0; k < d.scores.numel(); ++k) {
        const int64_t label = d.labels[k].item<int64_t>();
        const std::string name = image::label_name(model->id2label(), label);
        const float score = d.scores[k].item<float>();
        const auto box = print_detection(name, score, d.boxes[k]);
        ji["detections"].push_back(
            {{"label", label}, {"name", name}, {"score", score}, {"box", box}});
      }
      result["images"].push_back(ji);
      const std::string key = "img" + std::to_string(i) + "_";
      dump[key + "scores"] = d.scores;
      dump[key + "labels"] = d.labels;
      dump[key + "boxes"] = d.boxes;
    }
  } else {
    result["task"] = "image-classification";
    const auto cls = image::classify(logits, a.top_k > 0 ? a.top_k : 5);
    dump["probabilities"] = cls.probabilities;
    for (int64_t i = 0; i < logits.size(0); ++i) {
      std::cout << in.sources[i] << ":\n";
      json ji = {{"source", in.sources[i]}, {"top_k", json::array()}};
      for (int64_t k = 0; k < cls.scores.size(1); ++k) {
        const int64_t label = cls.labels[i][k].item<int64_t>();
        const std::string name = image::label_name(model->id2label(), label);
        const float p = cls.scores[i][k].item<float>();
        std::cout << "  " << std::left << std::setw(24) << name << std::right << " " << fmt(p, 4)
                  << "\n";
        ji["top_k"].push_back({{"label", label}, {"name", name}, {"probability", p}});
      }
      result["images"].push_back(ji);
    }
  }

  auto& registry = libreyolo::kernels::Registry::process_default();
  const auto report = registry.report();
  std::cout << "kernels:\n" << libreyolo::kernels::format_table(report);
  for (const auto& s : report) result["kernels"][s.slot] = s.selected;
  for (const auto& e : registry.events())
    std::cout << "fallback event: " << e.slot << "/" << e.impl << ": " << e.reason << "\n";

  if (ends_with(a.out, ".json")) {
    std::ofstream f(a.out);
    if (!f) throw std::runtime_error(a.out + ": cannot open for writing");
    f << result.dump(1) << "\n";
  } else if (ends_with(a.out, ".safetensors")) {
    libreyolo::tools::write_safetensors(a.out, dump);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      if (f == "--help" || f == "-h") {
        std::cout << kUsage;
        return 0;
      }
    }
    args = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "libreyolo-predict: " << e.what() << "\n" << kUsage;
    return 2;
  }
  // The CLI prints its own results and kernel table: log warnings and errors only, unless
  // LIBREYOLO_LOG_LEVEL says otherwise.
  libreyolo::log::Level level = libreyolo::log::Level::warn;
  if (const char* env = std::getenv("LIBREYOLO_LOG_LEVEL"); env && *env) {
    try {
      level = libreyolo::log::parse_level(env);
    } catch (const std::invalid_argument& e) {
      std::cerr << "libreyolo-predict: LIBREYOLO_LOG_LEVEL: " << e.what() << "\n";
      return 2;
    }
  }
  libreyolo::log::set_level(level);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-predict: error: " << e.what() << "\n";
    return 1;
  }
}
