// SwinForImageClassification (transformers 5.17 models/swin/modeling_swin.py), inference only.

#include "models/module_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"
#include "models/runtime/stream_guard.h"
#include "models/swin/swin.h"

namespace libreyolo::models {
namespace swin {

Config parse_config(const core::ConfigView& v, bool backbone) {
  Config c;
  c.image_size = v.get_int("image_size", 224);
  c.patch_size = v.get_int("patch_size", 4);
  c.num_channels = v.get_int("num_channels", 3);
  c.embed_dim = v.get_int("embed_dim", 96);
  c.window_size = v.get_int("window_size", 7);
  c.depths = v.get_int_list("depths", c.depths);
  c.num_heads = v.get_int_list("num_heads", c.num_heads);
  c.mlp_ratio = v.get_double("mlp_ratio", 4.0);
  c.layer_norm_eps = v.get_double("layer_norm_eps", 1e-5);
  c.qkv_bias = v.get_bool("qkv_bias", true);
  c.use_absolute_embeddings = v.get_bool("use_absolute_embeddings", false);
  try {
    c.act = layers::activation_from_name(v.get_string("hidden_act", "gelu"));
  } catch (const std::invalid_argument& e) {
    v.fail("hidden_act", e.what());
  }
  c.id2label = v.id2label();
  c.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  if (c.depths.empty() || c.depths.size() != c.num_heads.size())
    v.fail("num_heads", "must have one entry per stage of 'depths'");
  for (size_t s = 0; s < c.depths.size(); ++s) {
    const int64_t dim = c.embed_dim << s;
    if (c.num_heads[s] <= 0 || dim % c.num_heads[s] != 0)
      v.fail("num_heads", c10::str("stage ", s, ": ", dim, " channels not divisible by ",
                                   c.num_heads[s], " heads"));
  }
  if (c.patch_size <= 0) v.fail("patch_size", "must be positive");
  if (c.window_size <= 0) v.fail("window_size", "must be positive");
  if (!backbone && v.has("architectures")) {
    const auto& a = v.raw("architectures");
    if (!a.is_array() || a.empty() || a[0] != "SwinForImageClassification")
      v.fail("architectures", "only SwinForImageClassification is supported");
  }
  return c;
}

EncoderImpl::EncoderImpl(const Config& c) : config(c) {
  // timm: patch_embed.{proj, norm}; transformers: embeddings.{patch_embeddings.projection, norm}.
  auto embeddings =
      register_module(c.timm ? "patch_embed" : "embeddings", std::make_shared<torch::nn::Module>());
  auto patch = c.timm ? embeddings
                      : embeddings->register_module("patch_embeddings",
                                                    std::make_shared<torch::nn::Module>());
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = c.embed_dim;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = true;
  projection = patch->register_module(c.timm ? "proj" : "projection",
                                      std::make_shared<layers::Conv2dImpl>(po));
  embed_norm = embeddings->register_module(
      "norm", std::make_shared<layers::LayerNormImpl>(c.embed_dim, 1e-5));
  if (c.use_absolute_embeddings) {
    const int64_t grid = c.image_size / c.patch_size;
    position_embeddings = embeddings->register_parameter("position_embeddings",
                                                         at::empty({1, grid * grid, c.embed_dim}));
  }
  std::vector<std::shared_ptr<StageImpl>> ss;
  for (size_t s = 0; s < c.depths.size(); ++s) ss.push_back(std::make_shared<StageImpl>(c, s));
  if (c.timm) {  // features_only flattens the stages' nn.Sequential: layers_0, layers_1, ...
    for (size_t s = 0; s < ss.size(); ++s) register_module("layers_" + std::to_string(s), ss[s]);
    stages = ss;
  } else {
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    stages = layers::register_list(*encoder, "layers", ss);
  }
}

void EncoderImpl::prepare(const at::Device& device) {
  for (const auto& s : stages)
    for (const auto& b : s->blocks) b->prepare(device);
}

std::vector<StageOutput> EncoderImpl::forward(const at::Tensor& pixel_values,
                                              bool always_partition) const {
  const int64_t H = pixel_values.size(2), W = pixel_values.size(3), p = config.patch_size;
  // transformers SwinPatchEmbeddings.maybe_pad: right/bottom to a multiple of the patch.
  auto x = at::constant_pad_nd(pixel_values, {0, (p - W % p) % p, 0, (p - H % p) % p});
  x = projection->forward_patches(x);
  int64_t h = x.size(2), w = x.size(3);
  x = embed_norm->forward(x.flatten(2).transpose(1, 2));
  if (position_embeddings.defined()) {
    auto pos = position_embeddings;
    if (pos.size(1) != h * w || h != w) {
      // transformers SwinEmbeddings.interpolate_pos_encoding (bicubic, align_corners=False).
      const int64_t dim = pos.size(2);
      const auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(pos.size(1))));
      pos = at::upsample_bicubic2d(pos.reshape({1, side, side, dim}).permute({0, 3, 1, 2}),
                                   {H / p, W / p}, false)
                .permute({0, 2, 3, 1})
                .reshape({1, -1, dim});
      if (pos.size(1) != h * w)
        throw std::invalid_argument(c10::str("swin: position embeddings for ", H, "x", W,
                                             " need a size divisible by patch_size ", p));
    }
    x = x + pos;
  }
  std::vector<StageOutput> out;
  const auto merge = [&](const StageImpl& s) {
    x = s.downsample->forward(x, h, w);
    h = (h + 1) / 2;
    w = (w + 1) / 2;
  };
  for (const auto& s : stages) {
    if (s->downsample && s->merges_first) merge(*s);
    for (const auto& b : s->blocks) x = b->forward(x, h, w, always_partition);
    out.push_back({x, h, w});
    if (s->downsample && !s->merges_first) merge(*s);
  }
  return out;
}

namespace {

/// The module tree with the on-disk names ("swin.*", "classifier.*").
class SwinImpl : public torch::nn::Module {
 public:
  explicit SwinImpl(const Config& c) : config(c) {
    encoder = register_module("swin", std::make_shared<EncoderImpl>(c));
    const int64_t features = c.embed_dim << (c.depths.size() - 1);
    layernorm = encoder->register_module(
        "layernorm", std::make_shared<layers::LayerNormImpl>(features, c.layer_norm_eps));
    classifier =
        register_module("classifier", std::make_shared<layers::LinearImpl>(features, c.num_labels));
  }

  void prepare(const at::Device& device) { encoder->prepare(device); }

  at::Tensor forward(const at::Tensor& pixel_values) const {
    auto x = layernorm->forward(encoder->forward(pixel_values, false).back().hidden);
    auto pooled = at::adaptive_avg_pool1d(x.transpose(1, 2), {1}).flatten(1);
    return classifier->forward(pooled);
  }

  Config config;
  std::shared_ptr<EncoderImpl> encoder;
  layers::LayerNorm layernorm;
  layers::Linear classifier;
};

class SwinModel : public ModuleModel<SwinImpl> {
 public:
  SwinModel(std::shared_ptr<SwinImpl> net, const LoadOptions& options)
      : ModuleModel("swin", Task::image_classification, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.num_channels);
    ModelOutput out;
    out.logits = net_->forward(x).to(at::kFloat);
    return out;
  }
};

}  // namespace
}  // namespace swin

namespace {

/// Default of every Swin window-attention module's `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the swin_tiny fixture. It is not (max |SDPA - manual| ~1e-8..1e-7): manual.
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "swin" (`config` is the parsed
/// config.json; architecture SwinForImageClassification). Any input size is accepted: pixels are
/// padded to a multiple of `patch_size`, feature maps to a multiple of the window, odd maps
/// before patch merging. Stages whose map is not larger than the window use window = min(h, w)
/// and no shift (transformers `set_shift_and_window_size`); when that window is smaller than the
/// configured one, the relative-position bias reads the configured table at the smaller window's
/// offsets (transformers 5.17 fails with a shape error there). `relative_position_index` is
/// recomputed, never read from the file. Throws core::ConfigError / core::CheckpointError.
std::unique_ptr<Model> load_swin(const std::string& dir, const nlohmann::json& config,
                                 const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = swin::parse_config(view);
  auto net = std::make_shared<swin::SwinImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::LoadRules rules;
  // v4/Hub files store the derived index; it is recomputed (hf-models.md 7).
  rules.ignored_file_keys = {R"(.*\.relative_position_index)"};
  core::load_state_dict(*net, *file, rules, options.dtype, options.device);
  net->prepare(options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<swin::SwinModel>(std::move(net), options);
}

// Swin Transformer (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted
// Windows", ICCV 2021) as transformers 5.17 SwinForImageClassification
// (models/swin/modeling_swin.py), on-disk (legacy) parameter names: swin.embeddings.*,
// swin.encoder.layers.{s}.blocks.{b}.attention.self.*, swin.layernorm.*, classifier.*.
// forward(): pixel_values (B, num_channels, H, W) float, any size -> logits (B, num_labels)
// float32.
const FamilyRegistrar registered{
    Family{"swin", {"swin"}, /*order=*/90, load_swin}
        .predicts({Task::image_classification})
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"qkv_concat", {"SwinAttention", "SwinSelfAttention"}}}, {"qkv_concat"})};

}  // namespace
}  // namespace libreyolo::models
