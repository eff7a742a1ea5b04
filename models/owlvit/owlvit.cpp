// OwlViTForObjectDetection and Owlv2ForObjectDetection (transformers 5.17
// models/owlvit/modeling_owlvit.py, models/owlv2/modeling_owlv2.py), text-prompted detection
// only (no image-guided detection). The two differ by OWLv2's objectness head, their image
// processors (models/image/processor.h) and the box scaling of their post-processing; the CLIP
// towers are models/clip/.

#include <torch/nn/module.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/clip/clip.h"
#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/image/postprocess.h"
#include "models/image/query_selection.h"  // center_to_corners
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/prompted.h"
#include "models/registry/family.h"
#include "models/text/clip_tokenizer.h"

namespace libreyolo::models {
namespace owlvit {
namespace {

/// The most labels one image may carry. transformers sets none; the text tower runs once per
/// label, so a request's cost grows with it (10,000 labels would be 10,000 text forwards).
constexpr int64_t kMaxLabels = 256;

/// OwlViTConfig / Owlv2Config (configuration_owlvit.py, configuration_owlv2.py).
struct Config {
  clip::TowerConfig text, vision;
  int64_t projection_dim = 512;
  bool objectness = false;                  ///< OWLv2's objectness_head
  std::map<int64_t, std::string> id2label;  ///< unused: the labels are the prompts
};

/// config.json. Throws core::ConfigError naming the file and the field (architectures,
/// text_config.*, vision_config.*, projection_dim: the class head compares image features
/// mapped to text_config.hidden_size with projected queries, so the two must be equal).
Config parse_config(const core::ConfigView& v, bool v2) {
  const std::string arch = v2 ? "Owlv2ForObjectDetection" : "OwlViTForObjectDetection";
  if (v.has("architectures")) {
    const auto& a = v.raw("architectures");
    if (!a.is_array() || a.empty() || a[0] != arch)
      v.fail("architectures", "only " + arch + " is supported");
  }
  Config c;
  c.objectness = v2;
  if (!v.has("text_config")) v.fail("text_config", "missing");
  if (!v.has("vision_config")) v.fail("vision_config", "missing");
  c.text = clip::parse_text_config(v.child("text_config"));
  c.vision = clip::parse_vision_config(v.child("vision_config"));
  c.projection_dim = v.get_int("projection_dim", 512);
  if (c.projection_dim != c.text.hidden_size)
    v.fail("projection_dim", c10::str("must equal text_config.hidden_size (", c.text.hidden_size,
                                      "), got ", c.projection_dim));
  return c;
}

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// OwlViTBoxPredictionHead: dense0 -> GELU -> dense1 -> GELU -> dense2 (nn.GELU: erf).
class BoxHeadImpl : public torch::nn::Module {
 public:
  BoxHeadImpl(int64_t width, int64_t out) {
    dense0 = register_module("dense0", make<layers::LinearImpl>(width, width));
    dense1 = register_module("dense1", make<layers::LinearImpl>(width, width));
    dense2 = register_module("dense2", make<layers::LinearImpl>(width, out));
  }
  at::Tensor forward(const at::Tensor& x) const {
    auto h = at::gelu(dense0->forward(x));
    return dense2->forward(at::gelu(dense1->forward(h)));
  }
  layers::Linear dense0, dense1, dense2;
};

/// The module tree with the on-disk names: <base>.{text_model, vision_model,
/// visual_projection.weight, text_projection.weight, logit_scale}, class_head.{dense0,
/// logit_shift, logit_scale}, box_head.dense{0,1,2}, objectness_head.dense{0,1,2} (OWLv2),
/// layer_norm. (box_bias is a non-persistent buffer upstream: computed in forward here.)
class OwlImpl : public torch::nn::Module {
 public:
  OwlImpl(const Config& c, const std::string& base_name) : config(c) {
    auto base = register_module(base_name, make<torch::nn::Module>());
    text_model = base->register_module("text_model", make<clip::TextTransformerImpl>(c.text));
    vision_model = base->register_module(
        "vision_model", make<clip::VisionTransformerImpl>(c.vision, "pre_layernorm"));
    visual_projection = base->register_module(
        "visual_projection", make<layers::LinearImpl>(c.vision.hidden_size, c.projection_dim,
                                                      /*bias=*/false));
    text_projection = base->register_module(
        "text_projection",
        make<layers::LinearImpl>(c.text.hidden_size, c.projection_dim, /*bias=*/false));
    logit_scale = base->register_parameter("logit_scale", at::empty({}));
    const int64_t dv = c.vision.hidden_size;
    auto class_head = register_module("class_head", make<torch::nn::Module>());
    class_dense0 =
        class_head->register_module("dense0", make<layers::LinearImpl>(dv, c.text.hidden_size));
    logit_shift_head = class_head->register_module("logit_shift", make<layers::LinearImpl>(dv, 1));
    logit_scale_head = class_head->register_module("logit_scale", make<layers::LinearImpl>(dv, 1));
    box_head = register_module("box_head", make<BoxHeadImpl>(dv, 4));
    if (c.objectness)
      objectness_head = register_module("objectness_head", make<BoxHeadImpl>(dv, 1));
    layer_norm =
        register_module("layer_norm", make<layers::LayerNormImpl>(dv, c.vision.layer_norm_eps));
  }

  /// image_embedder: pixel_values (B, C, H, W) -> image_feats (B, (H/p) * (W/p), Dv), the
  /// patch tokens after post_layernorm, times the class token, then layer_norm.
  at::Tensor image_features(const at::Tensor& pixel_values) const {
    auto x = vision_model->post_layernorm->forward(vision_model->forward(pixel_values));
    const auto cls = x.slice(1, 0, 1);
    return layer_norm->forward(x.slice(1, 1) * cls);
  }

  /// OwlViTModel's text_embeds: input_ids (N, L) -> text_projection(pooled) / its L2 norm, (N, D).
  at::Tensor query_embeddings(const at::Tensor& input_ids) const {
    const auto t = text_projection->forward(text_model->pooled(input_ids));
    return t / at::linalg_vector_norm(t, 2, {-1}, /*keepdim=*/true);
  }

  /// compute_box_bias(h, w) (normalize_grid_corner_coordinates): (h * w, 4) float32, row-major
  /// over the grid: logit of each patch's bottom-right corner and of the patch size.
  static at::Tensor box_bias(int64_t h, int64_t w) {
    const auto f = at::TensorOptions().dtype(at::kFloat);
    const auto xs = at::arange(1, w + 1, f), ys = at::arange(1, h + 1, f);
    auto grid = at::meshgrid({xs, ys}, "xy");  // (h, w) each
    auto coords =
        at::stack({grid[0] / static_cast<double>(w), grid[1] / static_cast<double>(h)}, -1)
            .view({-1, 2})
            .clip(0.0, 1.0);
    auto logit = [](const at::Tensor& v) { return at::log(v + 1e-4) - at::log1p(-v + 1e-4); };
    auto size = at::full_like(coords, 1.0);
    size.select(-1, 0).div_(static_cast<double>(w));
    size.select(-1, 1).div_(static_cast<double>(h));
    return at::cat({logit(coords), logit(size)}, -1);
  }

  /// The heads on image_feats (B, N, Dv) of an h x w grid and queries (B, Q, D) with
  /// query_mask (B, Q) bool.
  PromptedOutput heads(const at::Tensor& feats, int64_t h, int64_t w, const at::Tensor& queries,
                       const at::Tensor& query_mask) const {
    // OwlViTClassPredictionHead.
    auto image_class = class_dense0->forward(feats);
    image_class = image_class / (at::linalg_vector_norm(image_class, 2, {-1}, true) + 1e-6);
    const auto q = queries / (at::linalg_vector_norm(queries, 2, {-1}, true) + 1e-6);
    auto logits = at::einsum("...pd,...qd->...pq", {image_class, q});
    const auto shift = logit_shift_head->forward(feats);
    const auto scale = at::elu(logit_scale_head->forward(feats)) + 1;
    logits = (logits + shift) * scale;
    logits = at::where(query_mask.unsqueeze(-2).logical_not(),
                       at::full({}, lowest_of(logits.scalar_type()), logits.options()), logits);
    PromptedOutput out;
    out.logits = logits.to(at::kFloat);
    auto boxes = box_head->forward(feats) + box_bias(h, w).to(feats.device(), feats.scalar_type());
    out.pred_boxes = at::sigmoid(boxes).to(at::kFloat);
    if (objectness_head)
      out.objectness_logits = objectness_head->forward(feats).select(-1, 0).to(at::kFloat);
    return out;
  }

  static double lowest_of(at::ScalarType t) {
    if (t == at::kHalf) return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    if (t == at::kBFloat16)
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    return static_cast<double>(std::numeric_limits<float>::lowest());
  }

  Config config;
  std::shared_ptr<clip::TextTransformerImpl> text_model;
  std::shared_ptr<clip::VisionTransformerImpl> vision_model;
  layers::Linear visual_projection, text_projection, class_dense0, logit_shift_head,
      logit_scale_head;
  at::Tensor logit_scale;
  std::shared_ptr<BoxHeadImpl> box_head, objectness_head;
  layers::LayerNorm layer_norm;
};

class OwlModel : public ModuleModel<OwlImpl>, public PromptedDetector {
 public:
  OwlModel(std::string model_type, std::shared_ptr<OwlImpl> net, text::ClipTokenizer tokenizer,
           const LoadOptions& options)
      : ModuleModel(std::move(model_type), Task::object_detection, std::move(net), options),
        tokenizer_(std::move(tokenizer)) {
    const int64_t positions = net_->config.text.max_position_embeddings;
    // OwlViTProcessor pads to the tokenizer's model_max_length (16 in google/owl*); a longer
    // one than the position table is cut to the table.
    text_length_ = tokenizer_.model_max_length() > 0
                       ? std::min(tokenizer_.model_max_length(), positions)
                       : positions;
  }

  /// Open-vocabulary: the labels are needed (forward_prompted).
  ModelOutput forward(const at::Tensor&, const at::Tensor&) const override {
    throw std::invalid_argument(model_type_ +
                                ": a text-prompted detector: its forward needs text queries");
  }

  int64_t max_labels() const override { return kMaxLabels; }
  int64_t max_text_length() const override { return text_length_; }

  TextQueries encode_labels(const std::vector<std::vector<std::string>>& labels) const override {
    const int64_t b = static_cast<int64_t>(labels.size());
    int64_t q = 0;
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i].empty())
        throw std::invalid_argument(c10::str("labels[", i, "]: an image needs at least one label"));
      if (static_cast<int64_t>(labels[i].size()) > kMaxLabels)
        throw std::invalid_argument(c10::str("labels[", i, "]: ", labels[i].size(),
                                             " labels, more than the ", kMaxLabels,
                                             " one image may have"));
      q = std::max(q, static_cast<int64_t>(labels[i].size()));
    }
    if (b == 0) throw std::invalid_argument("labels: no images");
    const int64_t len = text_length_;
    TextQueries out;
    out.input_ids = at::zeros({b, q, len}, at::kLong);
    out.attention_mask = at::zeros({b, q, len}, at::kLong);
    auto ids = out.input_ids.accessor<int64_t, 3>();
    auto mask = out.attention_mask.accessor<int64_t, 3>();
    out.truncated.resize(labels.size());
    for (int64_t i = 0; i < b; ++i) {
      for (size_t j = 0; j < labels[i].size(); ++j) {
        auto content = content_ids(labels, static_cast<size_t>(i), j);
        const bool cut = static_cast<int64_t>(content.size()) > len - 2;
        out.truncated[i].push_back(cut);
        if (cut) content.resize(len - 2);
        // <|startoftext|> content <|endoftext|>, then pad_token up to len (right padding).
        const auto jj = static_cast<int64_t>(j);
        int64_t k = 0;
        ids[i][jj][k] = tokenizer_.begin_id();
        mask[i][jj][k++] = 1;
        for (int64_t id : content) {
          ids[i][jj][k] = id;
          mask[i][jj][k++] = 1;
        }
        ids[i][jj][k] = tokenizer_.end_id();
        mask[i][jj][k++] = 1;
        for (; k < len; ++k) ids[i][jj][k] = tokenizer_.pad_id();
      }
    }
    out.input_ids = out.input_ids.to(options_.device);
    out.attention_mask = out.attention_mask.to(options_.device);
    return out;
  }

  PromptedOutput forward_prompted(const at::Tensor& pixel_values,
                                  const TextQueries& queries) const override {
    const auto& c = net_->config;
    const at::Tensor x = checked_input(pixel_values, c.vision.num_channels, c.vision.patch_size);
    const auto& ids = queries.input_ids;
    if (!ids.defined() || ids.dim() != 3 || ids.size(0) != x.size(0) || ids.size(1) < 1)
      throw std::invalid_argument(
          c10::str(model_type_, ": input_ids must be (B, Q, L) with B = ", x.size(0),
                   " and Q >= 1, got ", ids.defined() ? c10::str(ids.sizes()) : "undefined"));
    const int64_t b = ids.size(0), q = ids.size(1), len = ids.size(2);
    const auto flat = ids.to(options_.device, at::kLong).reshape({b * q, len});
    const auto embeds = net_->query_embeddings(flat).view({b, q, -1});
    // "If first token is 0, then this is a padded query".
    const auto query_mask = flat.select(1, 0).gt(0).view({b, q});
    const auto feats = net_->image_features(x);
    return net_->heads(feats, x.size(2) / c.vision.patch_size, x.size(3) / c.vision.patch_size,
                       embeds, query_mask);
  }

  std::vector<std::vector<bool>> truncation(
      const std::vector<std::vector<std::string>>& labels) const override {
    std::vector<std::vector<bool>> cut(labels.size());
    for (size_t i = 0; i < labels.size(); ++i)
      for (size_t j = 0; j < labels[i].size(); ++j)
        cut[i].push_back(static_cast<int64_t>(content_ids(labels, i, j).size()) > text_length_ - 2);
    return cut;
  }

  // The cache's pieces are the labels: each one's query embedding.

  bool caches_text() const override { return true; }

  std::vector<std::vector<std::string>> text_keys(
      const std::vector<std::vector<std::string>>& labels) const override {
    truncation(labels);  // encode_labels' checks: UTF-8, label counts
    return labels;
  }

  std::vector<EncodedText> encode_text(const std::vector<std::string>& keys) const override {
    const auto rows = label_embeddings(keys);
    std::vector<EncodedText> out;
    // Each row cloned so that it owns its memory (a view would keep the whole batch's storage
    // alive in the cache).
    for (int64_t i = 0; i < rows.size(0); ++i) out.push_back({{rows[i].clone()}});
    return out;
  }

  /// The labels' rows stacked per image and padded to the most labels with masked queries.
  PromptedOutput forward_encoded(
      const at::Tensor& pixel_values, const at::Tensor& pixel_mask,
      const std::vector<std::vector<EncodedText>>& pieces) const override {
    (void)pixel_mask;  // OWL takes none
    const auto b = static_cast<int64_t>(pieces.size());
    int64_t q = 0;
    for (const auto& image : pieces) {
      if (image.empty()) throw std::invalid_argument(model_type_ + ": an image without labels");
      for (const auto& p : image)
        if (p.tensors.size() != 1 || p.tensors[0].dim() != 1 ||
            p.tensors[0].size(0) != net_->config.projection_dim)
          throw std::invalid_argument(c10::str(model_type_, ": a label's encoding must be (",
                                               net_->config.projection_dim, ")"));
      q = std::max<int64_t>(q, static_cast<int64_t>(image.size()));
    }
    const auto options = at::TensorOptions().dtype(options_.dtype).device(options_.device);
    auto embeddings = at::zeros({b, q, net_->config.projection_dim}, options);
    auto query_mask = at::zeros({b, q}, options.dtype(at::kBool));
    for (int64_t i = 0; i < b; ++i) {
      const auto& image = pieces[static_cast<size_t>(i)];
      std::vector<at::Tensor> rows;
      for (const auto& p : image) rows.push_back(p.tensors[0]);
      const auto n = static_cast<int64_t>(image.size());
      embeddings[i].slice(0, 0, n).copy_(at::stack(rows));
      query_mask[i].slice(0, 0, n).fill_(true);
    }
    return forward_embedded(pixel_values, embeddings, query_mask);
  }

  /// post_process_object_detection's default threshold (0.1); no text threshold.
  PromptThresholds default_thresholds() const override { return {0.1, 0.0}; }
  bool uses_text_threshold() const override { return false; }

  /// OwlViTImageProcessor / Owlv2ImageProcessor.post_process_object_detection, then
  /// OwlViTProcessor.post_process_grounded_object_detection's text labels: score = sigmoid of
  /// each box's best logit, label its index; boxes (cx, cy, w, h) -> corners, scaled by (w, h,
  /// w, h) (OWL-ViT) or by max(h, w) on every coordinate (OWLv2: its processor padded the image
  /// to a square); kept where score > box_threshold, in box order (no top-k upstream).
  std::vector<PromptedDetections> post_process(
      const PromptedOutput& out, const std::vector<std::pair<int64_t, int64_t>>& target_sizes,
      const std::vector<std::vector<std::string>>& labels,
      const PromptThresholds& thresholds) const override {
    const int64_t b = out.logits.size(0);
    if (static_cast<int64_t>(target_sizes.size()) != b || static_cast<int64_t>(labels.size()) != b)
      throw std::invalid_argument(c10::str(model_type_, ": post_process of ", b, " images with ",
                                           target_sizes.size(), " target sizes and ", labels.size(),
                                           " label lists"));
    auto [best, index] = out.logits.max(-1);
    const auto scores = at::sigmoid(best);
    auto boxes = image::center_to_corners(out.pred_boxes);
    std::vector<float> scale;
    for (const auto& [h, w] : target_sizes) {
      const auto side = static_cast<float>(std::max(h, w));
      if (net_->config.objectness)
        scale.insert(scale.end(), {side, side, side, side});
      else
        scale.insert(scale.end(), {static_cast<float>(w), static_cast<float>(h),
                                   static_cast<float>(w), static_cast<float>(h)});
    }
    boxes = boxes * at::tensor(scale).view({b, 1, 4}).to(boxes.device());
    std::vector<PromptedDetections> result(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      const auto keep = scores[i].gt(thresholds.box_threshold);
      auto& r = result[static_cast<size_t>(i)];
      r.scores = scores[i].index({keep});
      r.labels = index[i].index({keep});
      r.boxes = boxes[i].index({keep});
      const auto host = r.labels.to(at::kCPU);
      const auto* l = host.data_ptr<int64_t>();
      for (int64_t k = 0; k < host.numel(); ++k) {
        const auto& mine = labels[static_cast<size_t>(i)];
        // A padding query never wins (its logit is the lowest), unless every score is: say so.
        r.phrases.push_back(l[k] < static_cast<int64_t>(mine.size()) ? mine[l[k]] : "");
      }
    }
    return result;
  }

 private:
  /// One query embedding per label, (n, D) in the model's dtype (the projected end token of the
  /// label's tokens, L2-normalised: what the class head compares). Any number of labels (a
  /// batch's distinct ones may exceed max_labels): tokenized max_labels at a time, one text
  /// forward over all of them.
  at::Tensor label_embeddings(const std::vector<std::string>& labels) const {
    std::vector<at::Tensor> ids;
    for (size_t from = 0; from < labels.size(); from += kMaxLabels) {
      const auto end = std::min(labels.size(), from + static_cast<size_t>(kMaxLabels));
      ids.push_back(encode_labels({{labels.begin() + from, labels.begin() + end}}).input_ids[0]);
    }
    if (ids.empty()) throw std::invalid_argument("labels: none to embed");
    return net_->query_embeddings(at::cat(ids));
  }

  /// forward_prompted with the labels embedded: embeddings (B, Q, D) (label_embeddings' rows,
  /// padded), query_mask (B, Q) bool (false: a padding label, masked to float32's lowest).
  PromptedOutput forward_embedded(const at::Tensor& pixel_values, const at::Tensor& embeddings,
                                  const at::Tensor& query_mask) const {
    const auto& c = net_->config;
    const at::Tensor x = checked_input(pixel_values, c.vision.num_channels, c.vision.patch_size);
    if (!embeddings.defined() || embeddings.dim() != 3 || embeddings.size(0) != x.size(0) ||
        embeddings.size(2) != c.projection_dim || !query_mask.defined() ||
        query_mask.sizes() != embeddings.sizes().slice(0, 2))
      throw std::invalid_argument(
          c10::str(model_type_, ": embeddings must be (B, Q, ", c.projection_dim,
                   ") with B = ", x.size(0), " and query_mask (B, Q), got ",
                   embeddings.defined() ? c10::str(embeddings.sizes()) : "undefined", " and ",
                   query_mask.defined() ? c10::str(query_mask.sizes()) : "undefined"));
    return net_->heads(
        net_->image_features(x), x.size(2) / c.vision.patch_size, x.size(3) / c.vision.patch_size,
        embeddings.to(options_.device, options_.dtype), query_mask.to(options_.device, at::kBool));
  }

  /// The content ids of labels[i][j]; std::invalid_argument "labels[i][j]: text: invalid UTF-8
  /// at byte k" for text that is not UTF-8.
  std::vector<int64_t> content_ids(const std::vector<std::vector<std::string>>& labels, size_t i,
                                   size_t j) const {
    try {
      return tokenizer_.content_ids(labels[i][j]);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(c10::str("labels[", i, "][", j, "]: ", e.what()));
    }
  }

  text::ClipTokenizer tokenizer_;
  int64_t text_length_ = 16;
};

}  // namespace
}  // namespace owlvit

namespace {

/// Default of the attention modules' `fused_attn` flag: the manual math, as every ViT-lineage
/// family until tests/parity/fused_attention_policy_test.cpp measures this one.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir` for config.json `model_type` "owlvit" / "owlv2": model.safetensors strictly (every
/// missing, unexpected or mis-shaped key named) and the CLIP tokenizer (tokenizer.json or
/// vocab.json + merges.txt, tokenizer_config.json). Throws core::ConfigError /
/// core::CheckpointError naming the file and the field or tensor key.
std::unique_ptr<Model> load_owl(const std::string& dir, const nlohmann::json& config,
                                const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const std::string type = view.get_string("model_type");
  const bool v2 = type == "owlv2";
  const auto c = owlvit::parse_config(view, v2);
  auto tokenizer = text::ClipTokenizer::from_folder(dir);
  if (tokenizer.vocab_size() > c.text.vocab_size)
    view.fail("text_config.vocab_size",
              c10::str("the tokenizer's ids reach ", tokenizer.vocab_size() - 1,
                       ", past the embedding table's ", c.text.vocab_size, " rows"));
  auto net = std::make_shared<owlvit::OwlImpl>(c, v2 ? "owlv2" : "owlvit");
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::load_state_dict(*net, *file, core::LoadRules{}, options.dtype, options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<owlvit::OwlModel>(type, std::move(net), std::move(tokenizer), options);
}

// OWL-ViT (Minderer et al., "Simple Open-Vocabulary Object Detection with Vision Transformers",
// ECCV 2022) and OWLv2 ("Scaling Open-Vocabulary Object Detection", NeurIPS 2023) as
// transformers 5.17 OwlViTForObjectDetection / Owlv2ForObjectDetection (google/owlvit-base-
// patch32, google/owlv2-base-patch16-ensemble): a CLIP ViT whose patch tokens, multiplied by
// the class token, become one box each (box head + the grid's box bias, sigmoid) and one logit
// per text query (cosine similarity with the CLIP text tower's projected end token, shifted
// and scaled per box); OWLv2 adds an objectness logit per box. Text-prompted: the Model is a
// PromptedDetector (models/prompted.h); forward() without text throws. Post-processing:
// PromptedDetector::post_process (DetectionHead::prompted).
const FamilyRegistrar registered{
    Family{"owlvit", {"owlvit", "owlv2"}, /*order=*/70, load_owl}
        .predicts({Task::object_detection}, image::DetectionHead::prompted)
        .fused_attention(kFusedAttentionDefault)};

}  // namespace
}  // namespace libreyolo::models
