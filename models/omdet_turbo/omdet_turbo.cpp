// OmDetTurboForObjectDetection (transformers 5.17 models/omdet_turbo/modeling_omdet_turbo.py),
// inference only; every step keeps transformers' operation order so that float32 results match.
// Shared parts: the Swin backbone (models/swin/backbone.h), CLIP's text tower (models/clip/),
// RT-DETR's hybrid encoder and deformable attention (models/rtdetr/), the CLIP tokenizer.

#include "models/omdet_turbo/omdet_turbo.h"

#include <c10/util/StringUtil.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/clip/clip.h"
#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/omdet_turbo/config.h"
#include "models/omdet_turbo/decoder.h"
#include "models/omdet_turbo/postprocess.h"
#include "models/prompted.h"
#include "models/registry/family.h"
#include "models/rtdetr/modules.h"
#include "models/swin/backbone.h"
#include "models/text/clip_tokenizer.h"

namespace libreyolo::models {
namespace omdet_turbo {

std::string default_task(const std::vector<std::string>& classes) {
  std::string task = "Detect ";
  for (size_t i = 0; i < classes.size(); ++i) task += (i ? ", " : "") + classes[i];
  return task + ".";
}

/// Multi-head attention modules' `fused_attn` default: the manual math (the parity bar is
/// float32 transformers eager; the decoder's task keys are masked by an additive bias).
constexpr bool kFusedAttentionDefault = false;

namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// OmDetTurboHybridEncoder.build_2d_sincos_position_embedding, in `dtype` as upstream computes
/// it: meshgrid(arange(w), arange(h), "ij") flattened, so that for h != w the positions are
/// not the map's row-major (h, w) (upstream's layout; [sin | cos] of the first grid, then of the
/// second). For h == w it is RT-DETR's [sin_h | cos_h | sin_w | cos_w].
at::Tensor position_embedding(int64_t h, int64_t w, int64_t dim, double temperature,
                              at::ScalarType dtype, const at::Device& device) {
  const auto o = at::TensorOptions().dtype(dtype).device(device);
  const auto grids = at::meshgrid({at::arange(w, o), at::arange(h, o)}, "ij");
  const int64_t pos_dim = dim / 4;
  const auto omega = at::pow(temperature, at::arange(pos_dim, o) / pos_dim).reciprocal();
  const auto out_w = at::matmul(grids[0].flatten().unsqueeze(-1), omega.unsqueeze(0));
  const auto out_h = at::matmul(grids[1].flatten().unsqueeze(-1), omega.unsqueeze(0));
  return at::cat({out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()}, 1).unsqueeze(0);
}

/// OmDet's CCFM blocks: ConvNormLayers with conv_norm_activation, CSPRepLayers with
/// csp_activation (RT-DETR uses one activation for both).
rtdetr::CCFMFactories omdet_ccfm(const Config& c) {
  const auto& h = c.hybrid;
  const int64_t e = h.encoder_hidden_dim;
  const auto act = c.conv_norm_activation;
  rtdetr::CCFMFactories f;
  f.lateral_conv = [h, e, act] {
    return rtdetr::ccfm_block(rtdetr::conv_norm(h, e, e, 1, 1, act));
  };
  f.fpn_block = [h] { return rtdetr::ccfm_block(make<rtdetr::CSPRepLayerImpl>(h)); };
  f.downsample_conv = [h, e, act] {
    return rtdetr::ccfm_block(rtdetr::conv_norm(h, e, e, 3, 2, act));
  };
  f.pan_block = f.fpn_block;
  f.position_embedding = position_embedding;
  return f;
}

/// The module tree with the on-disk names: vision_backbone.vision_backbone.*,
/// language_backbone.{model.*, text_projection}, encoder.*, decoder.*.
class OmDetTurboImpl : public torch::nn::Module {
 public:
  explicit OmDetTurboImpl(const Config& c) : config(c) {
    auto vision = register_module("vision_backbone", make<torch::nn::Module>());
    backbone = vision->register_module("vision_backbone", make<swin::BackboneImpl>(c.backbone));
    // A timm backbone's norms are OmDetTurboVisionBackbone's layer_norms on disk.
    if (c.backbone.swin.timm) layers::register_list(*vision, "layer_norms", backbone->norms);
    auto language = register_module("language_backbone", make<torch::nn::Module>());
    text_model = language->register_module("model", make<clip::TextTransformerImpl>(c.text));
    text_projection = language->register_parameter(
        "text_projection", at::empty({c.text_projection_in_dim, c.text_projection_out_dim}));
    encoder = register_module("encoder", make<rtdetr::HybridEncoderImpl>(c.hybrid, omdet_ccfm(c)));
    // OmDetTurboHybridEncoder holds its input projections (RT-DETR's model holds them).
    auto proj = encoder->register_module("channel_projection_layers", make<torch::nn::Module>());
    for (size_t i = 0; i < c.hybrid.encoder_in_channels.size(); ++i)
      channel_projection_layers.push_back(proj->register_module(
          std::to_string(i), layers::sequential_conv_bn(c.hybrid.encoder_in_channels[i],
                                                        c.hybrid.encoder_hidden_dim, 1, 1, 0,
                                                        1e-5)));  // nn.BatchNorm2d's default eps
    decoder = register_module("decoder", make<DecoderImpl>(c));
  }

  void prepare(const at::Device& device) { backbone->prepare(device); }

  /// The input side's stride: the last out stage's (patch_size * 2^(stage - 1)). The FPN's
  /// 2x upsampling meets the next level exactly only for multiples of it.
  int64_t stride() const {
    return config.backbone.swin.patch_size << (config.backbone.out_indices.back() - 1);
  }

  /// The language backbone's class side (encode_type "class"): ids (N, L) -> each class's
  /// end-token state through text_projection (N, E). CLIP reads every row alone.
  at::Tensor class_embeddings(const at::Tensor& ids) const {
    return at::matmul(text_model->pooled(ids), text_projection);
  }

  /// See TaskConditioned::forward_text; inputs checked and on the model's device.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const TextInputs& text) const {
    // get_language_embedding: the classes' end-token states through text_projection, regrouped
    // per image with zero padding classes (C, B, E); the task's states cut to the batch's
    // longest task (T, B, E).
    const auto class_embeddings = this->class_embeddings(text.classes_input_ids);
    const auto structure = text.classes_structure.to(at::kCPU);
    const int64_t b = structure.size(0);
    const int64_t most = structure.max().item<int64_t>();
    auto classes = at::zeros({most, b, class_embeddings.size(1)}, class_embeddings.options());
    int64_t start = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = structure[i].item<int64_t>();
      classes.select(1, i).slice(0, 0, n).copy_(class_embeddings.slice(0, start, start + n));
      start += n;
    }
    const auto mask = text.tasks_attention_mask;
    const int64_t len = mask.ne(0).sum(1).max().item<int64_t>();
    const auto task = text_model->forward(text.tasks_input_ids).slice(1, 0, len).transpose(0, 1);
    return forward_embedded(pixel_values, classes, task, mask.slice(1, 0, len));
  }

  /// The model past its language backbone: classes (C, B, E) (zero rows: padding classes), task
  /// (T, B, D) the task tokens' states, task_mask (B, T) nonzero on tokens (the decoder masks the
  /// others' keys) -> decoder_class_logits, decoder_coord_logits.
  std::pair<at::Tensor, at::Tensor> forward_embedded(const at::Tensor& pixel_values,
                                                     const at::Tensor& classes,
                                                     const at::Tensor& task,
                                                     const at::Tensor& task_mask) const {
    // OmDetTurboVisionBackbone (apply_layernorm_after_vision_backbone false) + hybrid encoder.
    std::vector<at::Tensor> projected;
    const auto features = backbone->forward(pixel_values);
    for (size_t l = 0; l < features.size(); ++l)
      projected.push_back(channel_projection_layers[l]->forward(features[l]));
    const auto pan = encoder->forward(std::move(projected));
    return decoder->forward(pan, classes, task, task_mask);
  }

  Config config;
  std::shared_ptr<swin::BackboneImpl> backbone;
  std::shared_ptr<clip::TextTransformerImpl> text_model;
  at::Tensor text_projection;
  std::shared_ptr<rtdetr::HybridEncoderImpl> encoder;
  std::vector<layers::ConvNorm> channel_projection_layers;
  std::shared_ptr<DecoderImpl> decoder;
};

/// The most classes of one image (the server's cap before tokenizing, as the other prompted
/// families').
constexpr int64_t kMaxLabels = 256;
/// post_process_grounded_object_detection's defaults.
constexpr double kThreshold = 0.3, kNmsThreshold = 0.5;

class OmDetTurboModel : public ModuleModel<OmDetTurboImpl>,
                        public TaskConditioned,
                        public PromptedDetector {
 public:
  OmDetTurboModel(std::shared_ptr<OmDetTurboImpl> net, text::ClipTokenizer tokenizer,
                  const LoadOptions& options)
      : ModuleModel("omdet-turbo", Task::object_detection, std::move(net), options),
        tokenizer_(std::move(tokenizer)) {}

  ModelOutput forward(const at::Tensor&, const at::Tensor&) const override {
    throw std::invalid_argument(model_type_ + ": needs text (classes and a task)");
  }

  TextInputs encode(const std::vector<std::vector<std::string>>& classes,
                    const std::vector<std::string>& tasks) const override {
    const auto task_texts = checked_tasks(classes, tasks);
    std::vector<std::string> flat;
    std::vector<int64_t> structure;
    for (const auto& image : classes) {
      flat.insert(flat.end(), image.begin(), image.end());
      structure.push_back(static_cast<int64_t>(image.size()));
    }
    TextInputs t;
    std::tie(t.classes_input_ids, std::ignore) = tokenize(flat);
    t.classes_structure = at::tensor(structure, at::kLong);
    std::tie(t.tasks_input_ids, t.tasks_attention_mask) = tokenize(task_texts);
    return t;
  }

  ModelOutput forward_text(const at::Tensor& pixel_values, const TextInputs& text) const override {
    const auto& c = net_->config;
    const at::Tensor x = check_input(pixel_values);
    const int64_t b = x.size(0);
    auto ids = [&](const at::Tensor& t, const char* name, int64_t rows) {
      if (!t.defined() || t.dim() != 2 || (rows >= 0 && t.size(0) != rows) || t.size(1) < 1 ||
          t.size(1) > c.text.max_position_embeddings ||
          !at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        throw std::invalid_argument(c10::str(
            model_type_, ": ", name, " must be an integer (", rows >= 0 ? c10::str(rows) : "N",
            ", L) tensor with 1 <= L <= ", c.text.max_position_embeddings, ", got ",
            t.defined() ? c10::str(t.sizes()) : "undefined"));
      const auto out = t.to(options_.device, at::kLong);
      if (out.lt(0).any().item<bool>() || out.ge(c.text.vocab_size).any().item<bool>())
        throw std::invalid_argument(
            c10::str(model_type_, ": ", name, " holds ids outside [0, ", c.text.vocab_size, ")"));
      return out;
    };
    const auto& s = text.classes_structure;
    if (!s.defined() || s.dim() != 1 || s.size(0) != b ||
        !at::isIntegralType(s.scalar_type(), false) || s.lt(1).any().item<bool>())
      throw std::invalid_argument(c10::str(model_type_, ": classes_structure must be (", b,
                                           ") integers >= 1, got ",
                                           s.defined() ? c10::str(s.sizes()) : "undefined"));
    TextInputs t;
    t.classes_structure = s.to(at::kLong);
    t.classes_input_ids =
        ids(text.classes_input_ids, "classes_input_ids", t.classes_structure.sum().item<int64_t>());
    t.tasks_input_ids = ids(text.tasks_input_ids, "tasks_input_ids", b);
    const auto& m = text.tasks_attention_mask;
    if (!m.defined() || m.sizes() != text.tasks_input_ids.sizes() ||
        !at::isIntegralType(m.scalar_type(), /*includeBool=*/true) ||
        !m.select(1, 0).ne(0).all().item<bool>())
      throw std::invalid_argument(
          c10::str(model_type_,
                   ": tasks_attention_mask must be an integer tensor shaped as "
                   "tasks_input_ids, nonzero on every task's first token"));
    t.tasks_attention_mask = m.to(options_.device, at::kLong);
    auto [logits, boxes] = net_->forward(x, t);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }

  // PromptedDetector (models/prompted.h): each image's labels are its classes, its task the
  // request's (encode_with_tasks) or the processor's default one. TextQueries layout (the
  // family's): input_ids / attention_mask (B, 1 + Cmax, 77), row 0 the task, rows 1.. the
  // classes (all-zero mask rows: padding).

  int64_t max_labels() const override { return kMaxLabels; }
  int64_t max_text_length() const override { return kTextLength; }

  TextQueries encode_labels(const std::vector<std::vector<std::string>>& labels) const override {
    return encode_with_tasks(labels, std::vector<std::string>(labels.size()));
  }

  bool uses_task() const override { return true; }

  /// A task is cut, as every text, past 75 content tokens (77 with the start and end tokens).
  bool task_truncated(const std::string& task) const override {
    return static_cast<int64_t>(checked_ids(task, "task").size()) > kTextLength - 2;
  }

  TextQueries encode_with_tasks(const std::vector<std::vector<std::string>>& labels,
                                const std::vector<std::string>& tasks) const override {
    const auto t = encode(labels, tasks);
    const int64_t b = static_cast<int64_t>(labels.size());
    const int64_t most = t.classes_structure.max().item<int64_t>();
    TextQueries q;
    q.input_ids = at::zeros({b, 1 + most, kTextLength}, at::kLong);
    q.attention_mask = at::zeros({b, 1 + most, kTextLength}, at::kLong);
    int64_t start = 0;
    for (int64_t i = 0; i < b; ++i) {
      const auto n = static_cast<int64_t>(labels[i].size());
      q.input_ids[i][0].copy_(t.tasks_input_ids[i]);
      q.attention_mask[i][0].copy_(t.tasks_attention_mask[i]);
      q.input_ids[i].slice(0, 1, 1 + n).copy_(t.classes_input_ids.slice(0, start, start + n));
      q.attention_mask[i]
          .slice(0, 1, 1 + n)
          .copy_(
              t.classes_input_ids.slice(0, start, start + n).ne(tokenizer_.pad_id()).to(at::kLong));
      start += n;
    }
    q.truncated = truncation(labels);
    q.input_ids = q.input_ids.to(options_.device);
    q.attention_mask = q.attention_mask.to(options_.device);
    return q;
  }

  PromptedOutput forward_prompted(const at::Tensor& pixel_values,
                                  const TextQueries& queries) const override {
    const auto& ids = queries.input_ids;
    const auto& mask = queries.attention_mask;
    if (!ids.defined() || ids.dim() != 3 || ids.size(1) < 2 || !mask.defined() ||
        mask.sizes() != ids.sizes())
      throw std::invalid_argument(
          c10::str(model_type_,
                   ": input_ids / attention_mask must be (B, 1 + classes, L) (the task, "
                   "then the classes), got ",
                   ids.defined() ? c10::str(ids.sizes()) : "undefined"));
    // Rows whose mask is all zero are padding classes.
    const auto present = mask.slice(1, 1).ne(0).any(-1).to(at::kCPU);  // (B, Cmax)
    TextInputs t;
    t.classes_structure = present.sum(1).to(at::kLong);
    t.classes_input_ids = ids.slice(1, 1).index({present.to(ids.device())});
    t.tasks_input_ids = ids.select(1, 0);
    t.tasks_attention_mask = mask.select(1, 0);
    PromptedOutput out;
    static_cast<ModelOutput&>(out) = forward_text(pixel_values, t);
    return out;
  }

  // The prompt cache (models/prompted.h caches_text): a piece per class, keyed by its text, and
  // one per task sentence, keyed by kTaskKey + its text (the default task spelled out), as
  // upstream's language_cache_class / language_cache_prompt keep them.

  bool caches_text() const override { return true; }

  std::vector<std::vector<std::string>> text_keys(
      const std::vector<std::vector<std::string>>& labels) const override {
    return text_keys_with_tasks(labels, std::vector<std::string>(labels.size()));
  }

  std::vector<std::vector<std::string>> text_keys_with_tasks(
      const std::vector<std::vector<std::string>>& labels,
      const std::vector<std::string>& tasks) const override {
    const auto task_texts = checked_tasks(labels, tasks);
    auto keys = labels;
    for (size_t b = 0; b < keys.size(); ++b) keys[b].push_back(kTaskKey + task_texts[b]);
    return keys;
  }

  /// Classes and tasks each in one text forward (77 tokens, as the processor pads them): a
  /// class {(E)}, a task {(T, D)} with T its own tokens (the padding past them never reaches
  /// the decoder: it masks their keys).
  std::vector<EncodedText> encode_text(const std::vector<std::string>& keys) const override {
    std::vector<std::string> texts[2];  // [0] classes, [1] tasks
    std::vector<std::pair<int, size_t>> where;
    for (size_t k = 0; k < keys.size(); ++k) {
      const bool task = !keys[k].empty() && keys[k][0] == kTaskKey;
      auto text = task ? keys[k].substr(1) : keys[k];
      checked_ids(text, c10::str(model_type_, ": keys[", k, "]"));
      where.emplace_back(task, texts[task].size());
      texts[task].push_back(std::move(text));
    }
    const auto device = options_.device;
    at::Tensor classes, tasks, lengths;
    if (!texts[0].empty()) classes = net_->class_embeddings(tokenize(texts[0]).first.to(device));
    if (!texts[1].empty()) {
      auto [ids, mask] = tokenize(texts[1]);
      tasks = net_->text_model->forward(ids.to(device));
      lengths = mask.ne(0).sum(1);
    }
    std::vector<EncodedText> out;
    for (const auto& [task, i] : where) {
      const auto n = static_cast<int64_t>(i);
      out.push_back(
          {{task ? tasks[n].slice(0, 0, lengths[n].item<int64_t>()).clone() : classes[n].clone()}});
    }
    return out;
  }

  PromptedOutput forward_encoded(
      const at::Tensor& pixel_values, const at::Tensor& pixel_mask,
      const std::vector<std::vector<EncodedText>>& pieces) const override {
    (void)pixel_mask;  // OmDet reads no pixel mask (one size per batch)
    const at::Tensor x = check_input(pixel_values);
    const int64_t b = x.size(0);
    if (static_cast<int64_t>(pieces.size()) != b)
      throw std::invalid_argument(
          c10::str(model_type_, ": ", pieces.size(), " encoded prompts for ", b, " images"));
    const auto& c = net_->config;
    const int64_t e = c.text_projection_out_dim, d = c.text_projection_in_dim;
    int64_t most = 0, longest = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto& p = pieces[i];
      auto shaped = [](const EncodedText& t, int64_t dim, int64_t width) {
        return t.tensors.size() == 1 && t.tensors[0].defined() && t.tensors[0].dim() == dim &&
               t.tensors[0].size(-1) == width && t.tensors[0].size(0) >= 1;
      };
      bool ok = p.size() >= 2 && shaped(p.back(), 2, d);
      for (size_t k = 0; ok && k + 1 < p.size(); ++k) ok = shaped(p[k], 1, e);
      if (!ok)
        throw std::invalid_argument(
            c10::str(model_type_, ": pieces[", i, "] must be class embeddings (", e,
                     ") then one task (T, ", d, "), from encode_text of text_keys' keys"));
      most = std::max<int64_t>(most, static_cast<int64_t>(p.size()) - 1);
      longest = std::max(longest, p.back().tensors[0].size(0));
    }
    const auto o = x.options();
    auto classes = at::zeros({most, b, e}, o);
    auto task = at::zeros({longest, b, d}, o);
    auto mask = at::zeros({b, longest}, o.dtype(at::kLong));
    for (int64_t i = 0; i < b; ++i) {
      const auto& p = pieces[static_cast<size_t>(i)];
      for (size_t k = 0; k + 1 < p.size(); ++k)
        classes[static_cast<int64_t>(k)][i].copy_(p[k].tensors[0]);
      const auto& t = p.back().tensors[0];
      task.select(1, i).slice(0, 0, t.size(0)).copy_(t);
      mask[i].slice(0, 0, t.size(0)).fill_(1);
    }
    auto [logits, boxes] = net_->forward_embedded(x, classes, task, mask);
    PromptedOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }

  /// A label is cut when its tokens pass 75 (the processor truncates every text to 77 with its
  /// start and end tokens).
  std::vector<std::vector<bool>> truncation(
      const std::vector<std::vector<std::string>>& labels) const override {
    std::vector<std::vector<bool>> cut(labels.size());
    for (size_t b = 0; b < labels.size(); ++b)
      for (size_t i = 0; i < labels[b].size(); ++i)
        cut[b].push_back(
            static_cast<int64_t>(
                checked_ids(labels[b][i], c10::str("labels[", b, "][", i, "]")).size()) >
            kTextLength - 2);
    return cut;
  }

  /// post_process_grounded_object_detection's defaults (threshold 0.3, nms_threshold 0.5).
  PromptThresholds default_thresholds() const override { return {kThreshold, 0.0, kNmsThreshold}; }
  bool uses_text_threshold() const override { return false; }
  bool uses_nms_threshold() const override { return true; }

  /// post_process_grounded_object_detection (postprocess.h) at box_threshold and
  /// nms_threshold; each box's label the class text.
  std::vector<PromptedDetections> post_process(
      const PromptedOutput& out, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
      const std::vector<std::vector<std::string>>& labels,
      const PromptThresholds& thresholds) const override {
    std::vector<int64_t> counts;
    for (const auto& l : labels) counts.push_back(static_cast<int64_t>(l.size()));
    const auto dets =
        post_process_grounded_object_detection(out.logits, out.pred_boxes, counts, target_sizes,
                                               thresholds.box_threshold, thresholds.nms_threshold);
    std::vector<PromptedDetections> result;
    for (size_t b = 0; b < dets.size(); ++b) {
      PromptedDetections p;
      static_cast<image::Detections&>(p) = dets[b];
      const auto* l = dets[b].labels.data_ptr<int64_t>();
      for (int64_t k = 0; k < dets[b].labels.numel(); ++k) p.phrases.push_back(labels[b][l[k]]);
      result.push_back(std::move(p));
    }
    return result;
  }

 private:
  at::Tensor check_input(const at::Tensor& pixel_values) const {
    const auto stride = net_->stride();
    check_pixel_values(model_type_, pixel_values, net_->config.backbone.swin.num_channels, stride,
                       stride);
    return pixel_values.to(options_.device, options_.dtype);
  }

  /// The first byte of a task's cache key: 0xFF starts no UTF-8 text, so no class key (a
  /// checked label) begins with it.
  static constexpr char kTaskKey = '\xff';

  /// Each image's task text (tasks[b], or default_task(classes[b]) for ""), after checking
  /// classes and tasks as encode documents (TaskConditioned::encode).
  std::vector<std::string> checked_tasks(const std::vector<std::vector<std::string>>& classes,
                                         const std::vector<std::string>& tasks) const {
    if (classes.empty()) throw std::invalid_argument("classes: no images");
    if (tasks.size() != classes.size())
      throw std::invalid_argument(
          c10::str("tasks: ", tasks.size(), " tasks for ", classes.size(), " images"));
    std::vector<std::string> task_texts;
    for (size_t b = 0; b < classes.size(); ++b) {
      if (classes[b].empty())
        throw std::invalid_argument(c10::str("labels[", b, "]: an image needs at least one label"));
      if (static_cast<int64_t>(classes[b].size()) > kMaxLabels)
        throw std::invalid_argument(c10::str("labels[", b, "]: ", classes[b].size(),
                                             " labels, more than the ", kMaxLabels,
                                             " one image may have"));
      for (size_t i = 0; i < classes[b].size(); ++i)
        checked_ids(classes[b][i], c10::str("labels[", b, "][", i, "]"));
      task_texts.push_back(tasks[b].empty() ? default_task(classes[b]) : tasks[b]);
      checked_ids(task_texts.back(), c10::str("tasks[", b, "]"));
    }
    return task_texts;
  }

  /// The content ids of `text`; std::invalid_argument "<what>: text: invalid UTF-8 at byte k".
  std::vector<int64_t> checked_ids(const std::string& text, const std::string& what) const {
    try {
      return tokenizer_.content_ids(text);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(what + ": " + e.what());
    }
  }

  /// The processor's tokenizer call: padding "max_length" 77, truncation (N, 77) ids and mask.
  std::pair<at::Tensor, at::Tensor> tokenize(const std::vector<std::string>& texts) const {
    const auto enc = tokenizer_.encode_batch(texts, text::Padding::kMaxLength, kTextLength);
    auto ids = at::empty({static_cast<int64_t>(texts.size()), kTextLength}, at::kLong);
    auto mask = at::empty_like(ids);
    for (size_t i = 0; i < enc.size(); ++i) {
      std::copy(enc[i].ids.begin(), enc[i].ids.end(), ids[i].data_ptr<int64_t>());
      std::copy(enc[i].attention_mask.begin(), enc[i].attention_mask.end(),
                mask[i].data_ptr<int64_t>());
    }
    return {ids, mask};
  }

  text::ClipTokenizer tokenizer_;
};

/// The AIFI attention's projections are query/key/value on disk (OmDetTurboMultiheadAttention),
/// q_proj/k_proj/v_proj in RT-DETR's module that runs them.
core::LoadRules load_rules() {
  core::LoadRules rules;
  rules.aliases = [](const std::string& key) {
    static const std::regex re(R"((encoder\.encoder\..*\.self_attn\.)(q|k|v)_proj\.(.*))");
    std::smatch m;
    std::vector<std::string> out;
    if (!std::regex_match(key, m, re)) return out;
    const std::string name = m[2] == "q" ? "query" : m[2] == "k" ? "key" : "value";
    out.push_back(std::string(m[1]) + name + "." + std::string(m[3]));
    return out;
  };
  rules.ignored_file_keys = {
      // Derived, recomputed; SwinBackbone's unused final norm (_keys_to_ignore_on_load_missing).
      R"(.*\.relative_position_index)", R"(vision_backbone\.vision_backbone\.swin\.layernorm\..*)",
      // Unused with apply_layernorm_after_vision_backbone false (the only supported value).
      R"(vision_backbone\.layer_norms\..*)",
      R"(language_backbone\.model\.embeddings\.position_ids)"};
  return rules;
}

}  // namespace
}  // namespace omdet_turbo

namespace {

/// Loads `dir` for config.json model_type "omdet-turbo": config.json (config.h's rules),
/// model.safetensors (strict), the CLIP tokenizer (tokenizer.json or vocab.json + merges.txt,
/// tokenizer_config.json). Throws core::ConfigError / core::CheckpointError naming the file and
/// the field or tensor key.
std::unique_ptr<Model> load_omdet_turbo(const std::string& dir, const nlohmann::json& config,
                                        const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = omdet_turbo::parse_config(view);
  auto tokenizer = text::ClipTokenizer::from_folder(dir);
  if (tokenizer.vocab_size() > c.text.vocab_size)
    view.fail("text_config.vocab_size",
              c10::str("the tokenizer's ids reach ", tokenizer.vocab_size() - 1,
                       ", past the embedding table's ", c.text.vocab_size, " rows"));
  auto net = std::make_shared<omdet_turbo::OmDetTurboImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::load_state_dict(*net, *file, omdet_turbo::load_rules(), options.dtype, options.device);
  net->prepare(options.device);
  layers::set_fused_attention(*net, omdet_turbo::kFusedAttentionDefault);
  return std::make_unique<omdet_turbo::OmDetTurboModel>(std::move(net), std::move(tokenizer),
                                                        options);
}

// OmDet-Turbo: Swin backbone (SwinBackbone or timm's SwinTransformer), RT-DETR-style hybrid encoder
// (AIFI + FPN/PAN), CLIP text encoder for the classes (end token, text_projection) and the task
// (every token), query selection by cosine similarity with the classes, deformable decoder whose
// self-attention also attends over the task tokens. TaskConditioned::forward_text
// (omdet_turbo.h) and PromptedDetector take the text; Model::forward without it throws.
const FamilyRegistrar registered{
    Family{"omdet_turbo", {"omdet-turbo"}, /*order=*/26, load_omdet_turbo}
        .predicts({Task::object_detection}, image::DetectionHead::prompted)
        .fused_attention(omdet_turbo::kFusedAttentionDefault)};

}  // namespace
}  // namespace libreyolo::models
