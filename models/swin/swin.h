// The layers of Swin (transformers 5.17 models/swin/modeling_swin.py) that
// SwinForImageClassification (swin.cpp) and the detectors' Swin backbones (SwinBackbone: Grounding
// DINO) share: the config, the (shifted) window block, patch merging, stages, and the embeddings +
// stages as one module.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "models/core/config.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/layers/packed_projections.h"
#include "models/runtime/constant_cache.h"
#include "models/runtime/stream_guard.h"
#include "models/swin/windows.h"

namespace libreyolo::models::swin {

using layers::Activation;

struct Config {
  int64_t image_size = 224, patch_size = 4, num_channels = 3, embed_dim = 96, window_size = 7;
  std::vector<int64_t> depths{2, 2, 6, 2}, num_heads{3, 6, 12, 24};
  double mlp_ratio = 4.0, layer_norm_eps = 1e-5;
  bool qkv_bias = true, use_absolute_embeddings = false;
  /// timm's SwinTransformer (timm 1.0 models/swin_transformer.py) instead of transformers':
  /// timm's module names (patch_embed.{proj, norm}, layers_{i}.blocks.{j}.{norm1,
  /// attn.{qkv, proj, relative_position_bias_table}, norm2, mlp.{fc1, fc2}}, the patch merging
  /// at the start of stages 1.. as layers_{i}.downsample (transformers': at the end of stages
  /// 0..n-2), q/k/v packed in one `qkv` Linear (layers::pack_projections)), and one difference
  /// in the computation: a shifted block rolls the unpadded map and pads it after
  /// (SwinTransformerBlock._attn), transformers pads first and rolls the padded map; the two
  /// differ where a map is not a multiple of the window (omlab/omdet-turbo-swin-tiny-hf: 160 /
  /// 80 / 40 / 20 with window 7). No absolute position embeddings (timm's `ape`).
  bool timm = false;
  Activation act = Activation::gelu;
  int64_t num_labels = 2;
  std::map<int64_t, std::string> id2label;
};

/// SwinConfig as config.json (or a detector's backbone_config) has it. Throws core::ConfigError
/// naming the field (num_heads per stage, patch_size, window_size, hidden_act; architectures,
/// when present, must be SwinForImageClassification unless `backbone` is true).
Config parse_config(const core::ConfigView& v, bool backbone = false);

/// transformers SwinLayer: (shifted) window attention + MLP, pre-norm, residuals.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const Config& c, int64_t dim, int64_t heads, int64_t shift)
      : window(c.window_size), shift(shift), heads(heads), timm(c.timm), act(c.act) {
    layernorm_before =
        register_module(timm ? "norm1" : "layernorm_before",
                        std::make_shared<layers::LayerNormImpl>(dim, c.layer_norm_eps));
    layernorm_after =
        register_module(timm ? "norm2" : "layernorm_after",
                        std::make_shared<layers::LayerNormImpl>(dim, c.layer_norm_eps));
    layers::AttentionOptions o;
    o.embed_dim = dim;
    o.num_heads = heads;
    o.bias = c.qkv_bias;
    o.q_name = "query";
    o.k_name = "key";
    o.v_name = "value";
    o.o_name = "";
    o.softmax_in_float32 = true;  // Swin eager softmax(dtype=float32)
    const auto hidden = static_cast<int64_t>(c.mlp_ratio * static_cast<double>(dim));
    const auto linear = [](int64_t in, int64_t out) {
      return std::make_shared<layers::LinearImpl>(in, out);
    };
    std::shared_ptr<torch::nn::Module> output, intermediate, out;
    if (timm) {  // attn.{qkv, proj, relative_position_bias_table}, mlp.{fc1, fc2}
      attention = register_module("attn", std::make_shared<layers::AttentionImpl>(o));
      layers::pack_projections(*attention, "qkv");
      output = attention;
      intermediate = out = register_module("mlp", std::make_shared<torch::nn::Module>());
    } else {  // attention.{self, output.dense}, intermediate.dense, output.dense
      auto attention_parent = register_module("attention", std::make_shared<torch::nn::Module>());
      attention =
          attention_parent->register_module("self", std::make_shared<layers::AttentionImpl>(o));
      output = attention_parent->register_module("output", std::make_shared<torch::nn::Module>());
      intermediate = register_module("intermediate", std::make_shared<torch::nn::Module>());
      out = register_module("output", std::make_shared<torch::nn::Module>());
    }
    // On-disk "attention.self." / "attn." + "relative_position_bias_table" ((2ws-1)^2, heads).
    table = attention->register_parameter("relative_position_bias_table",
                                          at::empty({(2 * window - 1) * (2 * window - 1), heads}));
    attention_out = output->register_module(timm ? "proj" : "dense", linear(dim, dim));
    fc1 = intermediate->register_module(timm ? "fc1" : "dense", linear(dim, hidden));
    fc2 = out->register_module(timm ? "fc2" : "dense", linear(hidden, dim));
  }

  /// Sets the derived (never stored) index tensor on `device` once the weights are loaded
  /// (timm: the q / k / v views into the loaded qkv too).
  void prepare(const at::Device& device) {
    full_index = relative_position_index(window, window).view({-1}).to(device);
    if (timm) layers::bind_packed_projections(*attention);
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

  /// x (B, h*w, C) -> (B, h*w, C). always_partition (transformers' SwinBackbone, timm's
  /// always_partition): the configured window and shift at every map size (the map padded to
  /// the window), never set_shift_and_window_size's one-window clamp.
  at::Tensor forward(const at::Tensor& x, int64_t height, int64_t width,
                     bool always_partition = false) const {
    // transformers set_shift_and_window_size: small maps use one window and no shift.
    int64_t ws = window, s = shift;
    if (!always_partition && std::min(height, width) <= window) {
      s = 0;
      ws = std::min(height, width);
    }
    const int64_t B = x.size(0), C = x.size(2);
    const int64_t hp = height + (ws - height % ws) % ws, wp = width + (ws - width % ws) % ws;
    // Pad, roll (timm rolls the unpadded map, transformers the padded one: Config::timm) and
    // window partition are a row gather done by the LayerNorm's own pass, window reverse, roll
    // back and crop one done by the residual add's (add_layer_norm's row orders): no copies.
    const auto windows =
        layernorm_before->forward_rows(x, at::Tensor(), window_order(height, width, ws, s, false))
            .second.view({-1, ws * ws, C});
    const auto [bias, bias_windows] = attention_bias(hp, wp, ws, s, B, windows.scalar_type());
    const auto a =
        attention_out->forward(attention->forward(windows, windows, windows, bias, bias_windows));
    const auto [y, yn] = layernorm_after->forward_rows(x, a.view({B, -1, C}), at::Tensor(),
                                                       window_order(height, width, ws, s, true));
    auto m = fc2->forward(layers::activate(act, fc1->forward(yn)));
    return m + y;
  }

  /// window_rows(...).rows (inverse: .inverse) of this block's order (Config::timm), kept per
  /// geometry.
  at::Tensor window_order(int64_t height, int64_t width, int64_t ws, int64_t s,
                          bool inverse) const {
    return rows_.get({height, width, ws, s, inverse ? 1 : 0}, table.device(), [&] {
      const auto order = window_rows(height, width, ws, s, timm, table.device());
      return inverse ? order.inverse : order.rows;
    });
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
  bool timm;  ///< Config::timm
  std::unique_ptr<BiasCache> cache_ = std::make_unique<BiasCache>();
  ConstantCache rows_;  ///< window_order()'s maps
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

/// One stage: its blocks and a patch merging, at the end of stages 0..n-2 (transformers' Swin)
/// or at the start of stages 1..n-1 (Config::timm: timm's SwinTransformerStage).
class StageImpl : public torch::nn::Module {
 public:
  StageImpl(const Config& c, size_t index) : merges_first(c.timm) {
    const int64_t dim = c.embed_dim << index;
    if (merges_first && index > 0)
      downsample = register_module("downsample", std::make_shared<PatchMergingImpl>(dim / 2));
    std::vector<std::shared_ptr<BlockImpl>> bs;
    for (int64_t b = 0; b < c.depths[index]; ++b)
      bs.push_back(std::make_shared<BlockImpl>(c, dim, c.num_heads[index],
                                               b % 2 == 0 ? 0 : c.window_size / 2));
    blocks = layers::register_list(*this, "blocks", bs);
    if (!merges_first && index + 1 < c.depths.size())
      downsample = register_module("downsample", std::make_shared<PatchMergingImpl>(dim));
  }
  bool merges_first;  ///< the patch merging (when any) runs before the blocks
  std::vector<std::shared_ptr<BlockImpl>> blocks;
  std::shared_ptr<PatchMergingImpl> downsample;
};

/// One stage's output: hidden states (B, height * width, C) before the stage's patch merging.
struct StageOutput {
  at::Tensor hidden;
  int64_t height = 0, width = 0;
};

/// SwinEmbeddings + SwinEncoder, on-disk children "embeddings.*" and "encoder.layers.*"
/// (registered as "swin" by SwinForImageClassification, as "model" by SwinBackbone users);
/// with Config::timm timm's "patch_embed.*" and "layers_{i}.*" (features_only's flattened
/// names: TimmBackbone "_backbone").
class EncoderImpl : public torch::nn::Module {
 public:
  explicit EncoderImpl(const Config& c);
  /// Sets the blocks' derived index tensors on `device` (after loading).
  void prepare(const at::Device& device);
  /// pixel_values (B, num_channels, H, W), any size (padded right/bottom to a multiple of
  /// patch_size) -> every stage's output before its patch merging (the last one is the
  /// encoder's last hidden state). always_partition: BlockImpl::forward. Throws
  /// std::invalid_argument when absolute position embeddings cannot be resized to the input.
  std::vector<StageOutput> forward(const at::Tensor& pixel_values, bool always_partition) const;

  Config config;
  layers::Conv2d projection;
  layers::LayerNorm embed_norm;
  at::Tensor position_embeddings;
  std::vector<std::shared_ptr<StageImpl>> stages;
};

}  // namespace libreyolo::models::swin
