// YolosForObjectDetection (transformers 5.17 models/yolos/modeling_yolos.py), inference only.
// The encoder layers are ViT's (models/vit/backbone.h LayerImpl: YolosLayer is a copy of
// ViTLayer); the embeddings differ (the detection tokens follow the patches, the position
// embeddings of a rectangular image_size are always resampled to the input) and so does the
// encoder (mid-position embeddings), so they live here.

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include "models/core/config.h"
#include "models/layers/layers.h"
#include "models/module_model.h"
#include "models/registry/family.h"
#include "models/vit/backbone.h"  // Config, LayerImpl, load_weights, interpolate_patch_positions

namespace libreyolo::models {
namespace yolos {
namespace {

/// YolosConfig (configuration_yolos.py): ViT's encoder fields plus these.
struct Config : vit::Config {
  int64_t image_height = 512, image_width = 864;  ///< image_size, the position grid's pixels
  int64_t num_detection_tokens = 100;
  bool use_mid_position_embeddings = true;
};

/// config.json. image_size is [height, width] (an int: square, as YolosPatchEmbeddings reads
/// it); patch_size an int (InterpolateInitialPositionEmbeddings divides by it). Throws
/// core::ConfigError naming the file and the field.
Config parse_config(const core::ConfigView& v) {
  Config c;
  static_cast<vit::Config&>(c) = vit::parse_encoder_config(v);
  vit::architecture(v, {"YolosForObjectDetection"});
  if (v.has("image_size") && v.raw("image_size").is_array()) {
    const auto size = v.get_int_list("image_size");
    if (size.size() != 2) v.fail("image_size", "must be [height, width] or an int");
    c.image_height = size[0];
    c.image_width = size[1];
  } else if (v.has("image_size")) {
    c.image_height = c.image_width = v.get_int("image_size");
  }
  if (c.image_height < c.patch_size || c.image_width < c.patch_size)
    v.fail("image_size", "each side must be at least patch_size");
  c.image_size = c.image_height;
  c.num_detection_tokens = v.get_int("num_detection_tokens", 100);
  if (c.num_detection_tokens < 1) v.fail("num_detection_tokens", "must be positive");
  c.use_mid_position_embeddings = v.get_bool("use_mid_position_embeddings", true);
  if (c.num_labels < 1) v.fail("num_labels", "must be positive");
  if (c.num_layers < 1) v.fail("num_hidden_layers", "must be positive");
  return c;
}

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// The module tree with the on-disk names: vit.embeddings.{cls_token, detection_tokens,
/// position_embeddings, patch_embeddings.projection.*}, vit.encoder.{layer.{i}.*,
/// mid_position_embeddings}, vit.layernorm.*, class_labels_classifier.layers.{0,1,2}.*,
/// bbox_predictor.layers.{0,1,2}.*.
class YolosImpl : public torch::nn::Module {
 public:
  explicit YolosImpl(const Config& c) : config(c) {
    const int64_t d = c.hidden_size;
    const int64_t grid = (c.image_height / c.patch_size) * (c.image_width / c.patch_size);
    const int64_t tokens = 1 + grid + c.num_detection_tokens;
    auto vit = register_module("vit", make<torch::nn::Module>());
    auto embeddings = vit->register_module("embeddings", make<torch::nn::Module>());
    cls_token = embeddings->register_parameter("cls_token", at::empty({1, 1, d}));
    detection_tokens = embeddings->register_parameter("detection_tokens",
                                                      at::empty({1, c.num_detection_tokens, d}));
    position_embeddings =
        embeddings->register_parameter("position_embeddings", at::empty({1, tokens, d}));
    auto patch = embeddings->register_module("patch_embeddings", make<torch::nn::Module>());
    layers::Conv2dOptions po;
    po.in = c.num_channels;
    po.out = d;
    po.kernel = c.patch_size;
    po.stride = c.patch_size;
    po.bias = true;
    projection = patch->register_module("projection", make<layers::Conv2dImpl>(po));
    auto encoder = vit->register_module("encoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<vit::LayerImpl>> ls;
    for (int64_t i = 0; i < c.num_layers; ++i) ls.push_back(make<vit::LayerImpl>(c));
    blocks = layers::register_list(*encoder, "layer", ls);
    if (c.use_mid_position_embeddings)  // (0, 1, S, D) with one layer, as upstream saves it
      mid_position_embeddings = encoder->register_parameter(
          "mid_position_embeddings", at::empty({c.num_layers - 1, 1, tokens, d}));
    layernorm = vit->register_module("layernorm", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
    class_labels_classifier = register_module("class_labels_classifier",
                                              make<layers::MLPImpl>(d, d, c.num_labels + 1, 3));
    bbox_predictor = register_module("bbox_predictor", make<layers::MLPImpl>(d, d, 4, 3));
  }

  /// InterpolateInitialPositionEmbeddings / InterpolateMidPositionEmbeddings: `positions`
  /// (N, 1 + grid + T, D) laid out [cls, patches of the image_size grid, detection tokens] ->
  /// (N, 1 + (H / p) * (W / p) + T, D), the patch rows resampled bicubically to the input's
  /// grid (always, as upstream: the same size resamples to itself).
  at::Tensor resample(const at::Tensor& positions, int64_t height, int64_t width) const {
    const int64_t t = config.num_detection_tokens, n = positions.size(1);
    const auto cls = positions.slice(1, 0, 1);
    const auto det = positions.slice(1, n - t);
    const auto patches = vit::interpolate_patch_positions(
        positions.slice(1, 1, n - t), config.image_height / config.patch_size,
        config.image_width / config.patch_size, height / config.patch_size,
        width / config.patch_size);
    return at::cat({cls, patches, det}, 1);
  }

  /// pixel_values (B, C, H, W), H, W >= patch_size -> logits (B, T, num_labels + 1) and
  /// pred_boxes (B, T, 4) (sigmoid, cx cy w h), T = num_detection_tokens.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values) const {
    const int64_t B = pixel_values.size(0), H = pixel_values.size(2), W = pixel_values.size(3);
    auto x = projection->forward_patches(pixel_values).flatten(2).transpose(1, 2);
    x = at::cat({cls_token.expand({B, -1, -1}), x, detection_tokens.expand({B, -1, -1})}, 1);
    x = x + resample(position_embeddings, H, W);
    at::Tensor mid;
    // (L - 1, 1, S, D) -> (L - 1, S', D): one row of position embeddings per layer but the last.
    if (mid_position_embeddings.defined()) mid = resample(mid_position_embeddings.squeeze(1), H, W);
    for (size_t i = 0; i < blocks.size(); ++i) {
      x = blocks[i]->forward(x);
      if (mid.defined() && i + 1 < blocks.size()) x = x + mid[static_cast<int64_t>(i)];
    }
    x = layernorm->forward(x);
    x = x.slice(1, x.size(1) - config.num_detection_tokens);
    return {class_labels_classifier->forward(x), bbox_predictor->forward(x).sigmoid()};
  }

  Config config;
  at::Tensor cls_token, detection_tokens, position_embeddings, mid_position_embeddings;
  layers::Conv2d projection;
  std::vector<std::shared_ptr<vit::LayerImpl>> blocks;
  layers::LayerNorm layernorm;
  layers::MLP class_labels_classifier, bbox_predictor;
};

class YolosModel : public ModuleModel<YolosImpl> {
 public:
  YolosModel(std::shared_ptr<YolosImpl> net, const LoadOptions& options)
      : ModuleModel("yolos", Task::object_detection, std::move(net), options) {}

  /// YOLOS takes no pixel_mask (YolosForObjectDetection.forward has none): the padding is
  /// encoded like any pixel, as upstream. A given mask is ignored.
  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const auto& c = net_->config;
    const at::Tensor x = checked_input(pixel_values, c.num_channels, c.patch_size);
    auto [logits, boxes] = net_->forward(x);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

}  // namespace
}  // namespace yolos

namespace {

/// Default of every YOLOS attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the yolos_tiny fixtures. It is not (as ViT's): manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "yolos" (architectures[0], when
/// present, must be YolosForObjectDetection). Strict (every missing, unexpected or mis-shaped
/// key named; a pooler, which YolosForObjectDetection does not build, is ignored). Throws
/// core::ConfigError / core::CheckpointError naming the file and the field or tensor key.
std::unique_ptr<Model> load_yolos(const std::string& dir, const nlohmann::json& config,
                                  const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = yolos::parse_config(view);
  auto net = std::make_shared<yolos::YolosImpl>(c);
  vit::load_weights(*net, dir, "vit", kFusedAttentionDefault, options);
  return std::make_unique<yolos::YolosModel>(std::move(net), options);
}

// YOLOS (Fang et al., "You Only Look at One Sequence", NeurIPS 2021) as transformers 5.17
// YolosForObjectDetection (models/yolos/modeling_yolos.py; hustvl/yolos-tiny, -small, -base): a
// ViT over [CLS, patches, detection tokens] with the position embeddings of config image_size
// resampled bicubically to the input, optional mid-position embeddings added after every layer
// but the last (use_mid_position_embeddings), the final LayerNorm, and 3-layer MLP heads on the
// detection tokens: class_labels_classifier (num_labels + 1: the last class is "no object") and
// bbox_predictor (sigmoid). forward() takes pixel_values (B, C, H, W), H, W >= patch_size (no
// pixel_mask); it returns logits (B, num_detection_tokens, num_labels + 1) and pred_boxes
// (B, num_detection_tokens, 4), float32. Post-processing:
// YolosImageProcessor.post_process_object_detection, DETR's (image::DetectionHead::detr).
const FamilyRegistrar registered{
    Family{"yolos", {"yolos"}, /*order=*/65, load_yolos}
        .predicts({Task::object_detection}, image::DetectionHead::detr)
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"qkv_concat", {"YolosAttention", "YolosSelfAttention"}}}, {"qkv_concat"})};

}  // namespace
}  // namespace libreyolo::models
