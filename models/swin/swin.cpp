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
#include "models/swin/windows.h"

namespace libreyolo::models {
namespace swin {
namespace {

using layers::Activation;

struct Config {
  int64_t image_size = 224, patch_size = 4, num_channels = 3, embed_dim = 96, window_size = 7;
  std::vector<int64_t> depths{2, 2, 6, 2}, num_heads{3, 6, 12, 24};
  double mlp_ratio = 4.0, layer_norm_eps = 1e-5;
  bool qkv_bias = true, use_absolute_embeddings = false;
  Activation act = Activation::gelu;
  int64_t num_labels = 2;
  std::map<int64_t, std::string> id2label;
};

Config parse_config(const core::ConfigView& v) {
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
  if (v.has("architectures")) {
    const auto& a = v.raw("architectures");
    if (!a.is_array() || a.empty() || a[0] != "SwinForImageClassification")
      v.fail("architectures", "only SwinForImageClassification is supported");
  }
  return c;
}

/// transformers SwinLayer: (shifted) window attention + MLP, pre-norm, residuals.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const Config& c, int64_t dim, int64_t heads, int64_t shift)
      : window(c.window_size), shift(shift), heads(heads), act(c.act) {
    layernorm_before = register_module(
        "layernorm_before", std::make_shared<layers::LayerNormImpl>(dim, c.layer_norm_eps));
    layernorm_after = register_module(
        "layernorm_after", std::make_shared<layers::LayerNormImpl>(dim, c.layer_norm_eps));
    auto attention_parent = register_module("attention", std::make_shared<torch::nn::Module>());
    layers::AttentionOptions o;
    o.embed_dim = dim;
    o.num_heads = heads;
    o.bias = c.qkv_bias;
    o.q_name = "query";
    o.k_name = "key";
    o.v_name = "value";
    o.o_name = "";
    o.softmax_in_float32 = true;  // Swin eager softmax(dtype=float32)
    attention =
        attention_parent->register_module("self", std::make_shared<layers::AttentionImpl>(o));
    // On-disk "attention.self.relative_position_bias_table" ((2ws-1)^2, heads).
    table = attention->register_parameter("relative_position_bias_table",
                                          at::empty({(2 * window - 1) * (2 * window - 1), heads}));
    auto output =
        attention_parent->register_module("output", std::make_shared<torch::nn::Module>());
    attention_out =
        output->register_module("dense", std::make_shared<layers::LinearImpl>(dim, dim));
    const auto hidden = static_cast<int64_t>(c.mlp_ratio * static_cast<double>(dim));
    auto intermediate = register_module("intermediate", std::make_shared<torch::nn::Module>());
    fc1 = intermediate->register_module("dense", std::make_shared<layers::LinearImpl>(dim, hidden));
    auto out = register_module("output", std::make_shared<torch::nn::Module>());
    fc2 = out->register_module("dense", std::make_shared<layers::LinearImpl>(hidden, dim));
  }

  /// Sets the derived (never stored) index tensor on `device` once the weights are loaded.
  void prepare(const at::Device& device) {
    full_index = relative_position_index(window, window).view({-1}).to(device);
  }

  /// (1, heads, ws*ws, ws*ws) relative position bias of an effective window `ws` <= window.
  at::Tensor position_bias(int64_t ws) const {
    const auto index = ws == window
                           ? full_index
                           : relative_position_index(ws, window).view({-1}).to(table.device());
    return table.index_select(0, index)
        .view({ws * ws, ws * ws, -1})
        .permute({2, 0, 1})
        .contiguous()
        .unsqueeze(0);
  }

  /// The attention bias of `images` images on a padded hp x wp map with effective window `ws`
  /// and shift `s`, and its bias_windows argument: the relative position bias (1, heads, n, n),
  /// plus the -100 shifted-window mask when s > 0 ((nW, heads, n, n), shared by the images),
  /// prepared for the attention path in use (layers::prepare_attention_bias: the memory-efficient
  /// kernel reads a 16-aligned copy replicated per image, a large share of a Swin-T stage-1 call
  /// when built per call: docs/BENCHMARKS.md, "Attention, manual vs SDPA"). The weights never
  /// change after loading, so the result is kept for the last (map, dtype, path) and reused
  /// (sliced for fewer images); nothing is kept from inside a CUDA-graph capture, whose work is
  /// only recorded. Thread-safe.
  std::pair<at::Tensor, int64_t> attention_bias(int64_t hp, int64_t wp, int64_t ws, int64_t s,
                                                int64_t images, at::ScalarType dtype) const {
    const auto device = table.device();
    const int64_t n = ws * ws;
    const auto path =
        attention->fused_attn
            ? layers::attention_path(device.type(), dtype,
                                     s > 0 ? layers::BiasKind::kWindow : layers::BiasKind::kDense,
                                     n, attention->head_dim)
            : layers::AttentionPath::kManual;
    const int64_t windows = s > 0 ? (hp / ws) * (wp / ws) : 0;
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto& c = *cache_;
    const bool same = c.bias.defined() && c.hp == hp && c.wp == wp && c.ws == ws && c.s == s &&
                      c.dtype == dtype && c.path == path;
    if (!same || (c.replicated && c.images < images)) {
      auto bias = position_bias(ws);
      if (s > 0) bias = bias + shifted_window_mask(hp, wp, ws, s, dtype, device).unsqueeze(1);
      auto prepared = layers::prepare_attention_bias(bias, windows * images, dtype, path);
      // prepare_attention_bias returns `bias` itself unless it replicated it per image.
      const bool replicated = windows > 0 && !prepared.is_same(bias);
      if (stream_is_capturing(device)) return slice_bias(prepared, replicated, windows, images);
      // Another stream may read it next: the one-time build must have run.
      StreamEvent built(device);
      built.record();
      built.synchronize();
      c.hp = hp, c.wp = wp, c.ws = ws, c.s = s, c.images = images;
      c.dtype = dtype;
      c.path = path;
      c.replicated = replicated;
      c.bias = prepared;
    }
    return slice_bias(c.bias, c.replicated, windows, images);
  }

  /// (bias, bias_windows) for `images` images from a bias replicated per image or shared.
  static std::pair<at::Tensor, int64_t> slice_bias(const at::Tensor& bias, bool replicated,
                                                   int64_t windows, int64_t images) {
    if (!replicated) return {bias, windows};
    return {bias.slice(0, 0, windows * images), windows * images};
  }

  /// x (B, h*w, C) -> (B, h*w, C).
  at::Tensor forward(const at::Tensor& x, int64_t height, int64_t width) const {
    // transformers set_shift_and_window_size: small maps use one window and no shift.
    int64_t ws = window, s = shift;
    if (std::min(height, width) <= window) {
      s = 0;
      ws = std::min(height, width);
    }
    const int64_t B = x.size(0), C = x.size(2);
    auto h = layernorm_before->forward(x).view({B, height, width, C});
    const int64_t pad_r = (ws - width % ws) % ws, pad_b = (ws - height % ws) % ws;
    h = at::constant_pad_nd(h, {0, 0, 0, pad_r, 0, pad_b});
    const int64_t hp = height + pad_b, wp = width + pad_r;
    if (s > 0) h = at::roll(h, {-s, -s}, {1, 2});
    auto windows = window_partition(h, ws).view({-1, ws * ws, C});
    const auto [bias, bias_windows] = attention_bias(hp, wp, ws, s, B, windows.scalar_type());
    auto a =
        attention_out->forward(attention->forward(windows, windows, windows, bias, bias_windows));
    a = window_reverse(a.view({-1, ws, ws, C}), ws, hp, wp);
    if (s > 0) a = at::roll(a, {s, s}, {1, 2});
    if (pad_r > 0 || pad_b > 0) a = a.slice(1, 0, height).slice(2, 0, width).contiguous();
    auto y = x + a.view({B, height * width, C});
    auto m = fc2->forward(layers::activate(act, fc1->forward(layernorm_after->forward(y))));
    return m + y;
  }

  /// What attention_bias() keeps, under its mutex.
  struct BiasCache {
    std::mutex mutex;
    int64_t hp = 0, wp = 0, ws = 0, s = 0, images = 0;
    at::ScalarType dtype = at::kFloat;
    layers::AttentionPath path = layers::AttentionPath::kManual;
    bool replicated = false;  ///< image-major (images * nW, ...): sliced for fewer images
    at::Tensor bias;
  };

  int64_t window, shift, heads;
  std::unique_ptr<BiasCache> cache_ = std::make_unique<BiasCache>();
  Activation act;
  layers::LayerNorm layernorm_before, layernorm_after;
  layers::Attention attention;
  at::Tensor table, full_index;
  layers::Linear attention_out, fc1, fc2;
};

/// transformers SwinPatchMerging: 2x2 neighbourhoods concatenated (odd maps zero-padded),
/// LayerNorm(4C), Linear(4C -> 2C, no bias).
class PatchMergingImpl : public torch::nn::Module {
 public:
  explicit PatchMergingImpl(int64_t dim) {
    reduction =
        register_module("reduction", std::make_shared<layers::LinearImpl>(4 * dim, 2 * dim, false));
    norm = register_module("norm", std::make_shared<layers::LayerNormImpl>(4 * dim, 1e-5));
  }
  at::Tensor forward(const at::Tensor& x, int64_t height, int64_t width) const {
    const int64_t B = x.size(0), C = x.size(2);
    auto h = x.view({B, height, width, C});
    if (height % 2 == 1 || width % 2 == 1)
      h = at::constant_pad_nd(h, {0, 0, 0, width % 2, 0, height % 2});
    // Order of transformers: [row0 col0, row1 col0, row0 col1, row1 col1].
    h = at::cat({h.slice(1, 0, c10::nullopt, 2).slice(2, 0, c10::nullopt, 2),
                 h.slice(1, 1, c10::nullopt, 2).slice(2, 0, c10::nullopt, 2),
                 h.slice(1, 0, c10::nullopt, 2).slice(2, 1, c10::nullopt, 2),
                 h.slice(1, 1, c10::nullopt, 2).slice(2, 1, c10::nullopt, 2)},
                -1);
    h = h.view({B, -1, 4 * C});
    return reduction->forward(norm->forward(h));
  }
  layers::Linear reduction;
  layers::LayerNorm norm;
};

class StageImpl : public torch::nn::Module {
 public:
  StageImpl(const Config& c, size_t index) {
    const int64_t dim = c.embed_dim << index;
    std::vector<std::shared_ptr<BlockImpl>> bs;
    for (int64_t b = 0; b < c.depths[index]; ++b)
      bs.push_back(std::make_shared<BlockImpl>(c, dim, c.num_heads[index],
                                               b % 2 == 0 ? 0 : c.window_size / 2));
    blocks = layers::register_list(*this, "blocks", bs);
    if (index + 1 < c.depths.size())
      downsample = register_module("downsample", std::make_shared<PatchMergingImpl>(dim));
  }
  std::vector<std::shared_ptr<BlockImpl>> blocks;
  std::shared_ptr<PatchMergingImpl> downsample;
};

/// The module tree with the on-disk names ("swin.*", "classifier.*").
class SwinImpl : public torch::nn::Module {
 public:
  explicit SwinImpl(const Config& c) : config(c) {
    auto swin = register_module("swin", std::make_shared<torch::nn::Module>());
    auto embeddings = swin->register_module("embeddings", std::make_shared<torch::nn::Module>());
    auto patch =
        embeddings->register_module("patch_embeddings", std::make_shared<torch::nn::Module>());
    layers::Conv2dOptions po;
    po.in = c.num_channels;
    po.out = c.embed_dim;
    po.kernel = c.patch_size;
    po.stride = c.patch_size;
    po.bias = true;
    projection = patch->register_module("projection", std::make_shared<layers::Conv2dImpl>(po));
    embed_norm = embeddings->register_module(
        "norm", std::make_shared<layers::LayerNormImpl>(c.embed_dim, 1e-5));
    if (c.use_absolute_embeddings) {
      const int64_t grid = c.image_size / c.patch_size;
      position_embeddings = embeddings->register_parameter(
          "position_embeddings", at::empty({1, grid * grid, c.embed_dim}));
    }
    auto encoder = swin->register_module("encoder", std::make_shared<torch::nn::Module>());
    std::vector<std::shared_ptr<StageImpl>> ss;
    for (size_t s = 0; s < c.depths.size(); ++s) ss.push_back(std::make_shared<StageImpl>(c, s));
    stages = layers::register_list(*encoder, "layers", ss);
    const int64_t features = c.embed_dim << (c.depths.size() - 1);
    layernorm = swin->register_module(
        "layernorm", std::make_shared<layers::LayerNormImpl>(features, c.layer_norm_eps));
    classifier =
        register_module("classifier", std::make_shared<layers::LinearImpl>(features, c.num_labels));
  }

  void prepare(const at::Device& device) {
    for (const auto& s : stages)
      for (const auto& b : s->blocks) b->prepare(device);
  }

  at::Tensor forward(const at::Tensor& pixel_values) const {
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
    for (const auto& s : stages) {
      for (const auto& b : s->blocks) x = b->forward(x, h, w);
      if (s->downsample) {
        x = s->downsample->forward(x, h, w);
        h = (h + 1) / 2;
        w = (w + 1) / 2;
      }
    }
    x = layernorm->forward(x);
    auto pooled = at::adaptive_avg_pool1d(x.transpose(1, 2), {1}).flatten(1);
    return classifier->forward(pooled);
  }

  Config config;
  layers::Conv2d projection;
  layers::LayerNorm embed_norm, layernorm;
  at::Tensor position_embeddings;
  std::vector<std::shared_ptr<StageImpl>> stages;
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
