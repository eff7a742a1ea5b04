// DEIMv2's DINOv3 conv encoder, in transformers 5.17's operation order
// (modeling_dinov3_vit.py DINOv3ViTBackbone; modeling_deimv2.py Deimv2DINOv3ConvEncoder,
// Deimv2SpatialTuningAdapter).
#include "models/deimv2/dinov3_backbone.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "models/core/state_dict.h"

namespace libreyolo::models::deimv2 {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// BackboneMixin's out_features entry -> stage index ("stem" 0, "stageN" N); -1 if neither.
int64_t stage_index(const std::string& name) {
  if (name == "stem") return 0;
  if (name.rfind("stage", 0) != 0 || name.size() == 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

}  // namespace

Dinov3Config Dinov3Config::parse(const core::ConfigView& cfg) {
  Dinov3Config c;
  c.adapter_inplanes = cfg.get_int("spatial_tuning_adapter_inplanes", c.adapter_inplanes);
  if (c.adapter_inplanes <= 0) cfg.fail("spatial_tuning_adapter_inplanes", "must be positive");
  const auto b = cfg.child("backbone_config");
  c.hidden_size = b.get_int("hidden_size", c.hidden_size);
  c.intermediate_size = b.get_int("intermediate_size", c.intermediate_size);
  c.num_layers = b.get_int("num_hidden_layers", c.num_layers);
  c.num_heads = b.get_int("num_attention_heads", c.num_heads);
  c.num_channels = b.get_int("num_channels", c.num_channels);
  c.num_register_tokens = b.get_int("num_register_tokens", c.num_register_tokens);
  c.layer_norm_eps = b.get_double("layer_norm_eps", c.layer_norm_eps);
  c.rope_theta = b.get_double("rope_theta", c.rope_theta);
  c.query_bias = b.get_bool("query_bias", c.query_bias);
  c.key_bias = b.get_bool("key_bias", c.key_bias);
  c.value_bias = b.get_bool("value_bias", c.value_bias);
  c.proj_bias = b.get_bool("proj_bias", c.proj_bias);
  c.mlp_bias = b.get_bool("mlp_bias", c.mlp_bias);
  c.use_gated_mlp = b.get_bool("use_gated_mlp", c.use_gated_mlp);
  c.apply_layernorm = b.get_bool("apply_layernorm", c.apply_layernorm);
  try {
    c.act = layers::activation_from_name(b.get_string("hidden_act", "gelu"));
  } catch (const std::invalid_argument& e) {
    b.fail("hidden_act", e.what());
  }
  if (b.has("patch_size") && !b.raw("patch_size").is_number_integer())
    b.fail("patch_size", "must be an integer (DINOv3ViTRopePositionEmbedding divides by it)");
  c.patch_size = b.get_int("patch_size", c.patch_size);
  if (c.patch_size != 16)
    b.fail("patch_size",
           "must be 16: the spatial tuning adapter's maps are at strides 8, 16, 32 "
           "and Deimv2DINOv3ConvEncoder concatenates them with the backbone's "
           "resized to patch grids x2, x1, x1/2, found " +
               std::to_string(c.patch_size));
  if (c.num_channels != 3)
    b.fail("num_channels", "must be 3 (the spatial tuning adapter reads 3 channels)");
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
    b.fail("num_attention_heads", "hidden_size must be a positive multiple of it");
  if ((c.hidden_size / c.num_heads) % 4 != 0)
    b.fail("num_attention_heads",
           "the head size hidden_size / num_attention_heads must be a "
           "multiple of 4 (2-D RoPE)");
  if (c.num_layers < 1) b.fail("num_hidden_layers", "must be positive");
  if (c.intermediate_size < 1) b.fail("intermediate_size", "must be positive");
  if (c.num_register_tokens < 0) b.fail("num_register_tokens", "must not be negative");
  if (!b.get_bool("reshape_hidden_states", true))
    b.fail("reshape_hidden_states", "must be true (the encoder resizes (B, C, h, w) maps)");
  if (b.has("out_indices") && !b.raw("out_indices").is_null()) {
    c.out_indices = b.get_int_list("out_indices");
  } else if (b.has("out_features") && !b.raw("out_features").is_null()) {
    for (const auto& f : b.raw("out_features")) {
      const int64_t i = f.is_string() ? stage_index(f.get<std::string>()) : -1;
      if (i < 0) b.fail("out_features", "entries must be \"stem\" or \"stageN\"");
      c.out_indices.push_back(i);
    }
  } else {
    c.out_indices = {c.num_layers};
  }
  for (size_t i = 0; i < c.out_indices.size(); ++i) {
    if (c.out_indices[i] < 0 || c.out_indices[i] > c.num_layers)
      b.fail("out_indices", "entries must be in [0, num_hidden_layers]");
    if (i > 0 && c.out_indices[i] <= c.out_indices[i - 1])
      b.fail("out_indices", "must be strictly increasing");
  }
  if (c.out_indices.size() != 3)
    b.fail("out_indices",
           "needs 3 entries (Deimv2DINOv3ConvEncoder's 3 fusion_proj levels), found " +
               core::shape_string(c.out_indices));
  return c;
}

Dinov3LayerImpl::Dinov3LayerImpl(const Dinov3Config& c) : act(c.act) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  norm1 = register_module("norm1", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = c.num_heads;
  o.o_name = "o_proj";
  o.softmax_in_float32 = false;  // eager_attention_forward: softmax in the input dtype
  o.scale = std::pow(static_cast<double>(d / c.num_heads), -0.5);  // head_dim**-0.5
  attention = register_module("attention", make<layers::AttentionImpl>(o));
  // AttentionOptions has one bias flag; DINOv3 has one per projection (key_bias false by default).
  auto no_bias = [&](const char* name, layers::Linear& slot, bool bias) {
    if (!bias) slot = attention->replace_module(name, make<layers::LinearImpl>(d, d, false));
  };
  no_bias("q_proj", attention->q_proj, c.query_bias);
  no_bias("k_proj", attention->k_proj, c.key_bias);
  no_bias("v_proj", attention->v_proj, c.value_bias);
  no_bias("o_proj", attention->o_proj, c.proj_bias);
  auto ls1 = register_module("layer_scale1", make<torch::nn::Module>());
  lambda1 = ls1->register_parameter("lambda1", at::empty({d}));
  norm2 = register_module("norm2", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto mlp = register_module("mlp", make<torch::nn::Module>());
  if (c.use_gated_mlp)
    gate_proj = mlp->register_module("gate_proj", make<layers::LinearImpl>(d, f, c.mlp_bias));
  up_proj = mlp->register_module("up_proj", make<layers::LinearImpl>(d, f, c.mlp_bias));
  down_proj = mlp->register_module("down_proj", make<layers::LinearImpl>(f, d, c.mlp_bias));
  auto ls2 = register_module("layer_scale2", make<torch::nn::Module>());
  lambda2 = ls2->register_parameter("lambda1", at::empty({d}));
}

layers::PendingResidual Dinov3LayerImpl::forward_pending(const layers::PendingResidual& in,
                                                         const RopeTables& rope) const {
  // Upstream: y = ls1 * o_proj(attention(norm1(x))) + x; out = ls2 * mlp(norm2(y)) + y.
  const auto [x, h] = norm1->forward_add(in.residual, in.delta, in.scale);
  const int64_t B = x.size(0), L = x.size(1), H = attention->num_heads;
  const int64_t hd = attention->head_dim;
  auto heads = [&](const at::Tensor& t) { return t.view({B, L, H, hd}).transpose(1, 2); };
  at::Tensor q, k, v;
  if (attention->concat_projections == 3) {
    // The qkv_concat layout (models/layouts/): one GEMM for the three projections (same input).
    const auto packed =
        at::linear(h, attention->in_proj_weight, attention->in_proj_bias).view({B, L, 3, H, hd});
    // apply_rotary_pos_emb on q and k at once: (2, B, H, L, hd) from the packed rows.
    const at::Tensor qk = kernels::rotary_embedding(
        rope_kernel, packed.narrow(2, 0, 2).permute({2, 0, 3, 1, 4}), rope.cos, rope.signed_sin);
    q = qk.select(0, 0);
    k = qk.select(0, 1);
    v = packed.select(2, 2).transpose(1, 2);
  } else {
    q = kernels::rotary_embedding(rope_kernel, heads(attention->q_proj->forward(h)), rope.cos,
                                  rope.signed_sin);
    k = kernels::rotary_embedding(rope_kernel, heads(attention->k_proj->forward(h)), rope.cos,
                                  rope.signed_sin);
    v = heads(attention->v_proj->forward(h));
  }
  at::Tensor a = kernels::attention(attention->attention_kernel, attention->fused_attn, q, k, v,
                                    at::Tensor(), {attention->scale, false, 0});
  a = attention->o_proj->forward(a.transpose(1, 2).reshape({B, L, H * hd}));
  auto [y, n] = norm2->forward_add(x, a, lambda1);
  // The plain MLP's up projection and activation through the linear_act slot, as RF-DETR's and
  // LW-DETR's ViT MLPs run them (one GEMM with the activation in its epilogue on CUDA in 16 bits).
  at::Tensor m = gate_proj ? layers::activate(act, gate_proj->forward(n)) * up_proj->forward(n)
                           : up_proj->forward_act(n, act);
  return {std::move(y), down_proj->forward(m), lambda2};
}

Dinov3BackboneImpl::Dinov3BackboneImpl(const Dinov3Config& c) : config(c) {
  const int64_t d = c.hidden_size;
  auto embeddings = register_module("embeddings", make<torch::nn::Module>());
  cls_token = embeddings->register_parameter("cls_token", at::empty({1, 1, d}));
  mask_token = embeddings->register_parameter("mask_token", at::empty({1, 1, d}));
  register_tokens =
      embeddings->register_parameter("register_tokens", at::empty({1, c.num_register_tokens, d}));
  layers::Conv2dOptions po;
  po.in = c.num_channels;
  po.out = d;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  po.bias = true;
  patch_embeddings = embeddings->register_module("patch_embeddings", make<layers::Conv2dImpl>(po));
  std::vector<std::shared_ptr<Dinov3LayerImpl>> ls;
  for (int64_t i = 0; i < c.num_layers; ++i) ls.push_back(make<Dinov3LayerImpl>(c));
  blocks = layers::register_list(*this, "layer", ls);
  norm = register_module("norm", make<layers::LayerNormImpl>(d, c.layer_norm_eps));
  // inv_freq = 1 / base ** arange(0, 1, 4 / head_dim) in float32 (a non-persistent buffer).
  const int64_t head_dim = d / c.num_heads;
  inv_freq = at::pow(c.rope_theta, at::arange(0.0, 1.0, 4.0 / static_cast<double>(head_dim),
                                              at::TensorOptions().dtype(at::kFloat)))
                 .reciprocal();
}

void Dinov3BackboneImpl::prepare() { inv_freq = inv_freq.to(patch_embeddings->weight.device()); }

std::pair<at::Tensor, at::Tensor> Dinov3BackboneImpl::rope(int64_t h, int64_t w,
                                                           at::ScalarType dtype) const {
  // get_patches_center_coordinates: (y, x) patch centres in [-1, 1], row-major (h * w, 2).
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(inv_freq.device());
  const at::Tensor ch = at::arange(0.5, static_cast<double>(h), 1.0, f32) / h;
  const at::Tensor cw = at::arange(0.5, static_cast<double>(w), 1.0, f32) / w;
  const auto grid = at::meshgrid({ch, cw}, "ij");
  const at::Tensor coords = at::stack(grid, -1).flatten(0, 1) * 2.0 - 1.0;
  // angles = 2 pi * coords[:, :, None] * inv_freq[None, None, :], flattened, tiled twice.
  const at::Tensor angles = (coords.unsqueeze(-1) * (2.0 * M_PI) * inv_freq.view({1, 1, -1}))
                                .flatten(1, 2)
                                .repeat({1, 2});
  return {at::cos(angles).to(dtype), at::sin(angles).to(dtype)};
}

RopeTables Dinov3BackboneImpl::rope_tables(int64_t h, int64_t w, at::ScalarType dtype) const {
  const at::Tensor tables =
      rope_cache_.get({h, w, static_cast<int64_t>(dtype)}, inv_freq.device(), [&] {
        const auto [cos, sin] = rope(h, w, dtype);
        const int64_t half = sin.size(1) / 2;
        return at::stack({cos, at::cat({-sin.narrow(1, 0, half), sin.narrow(1, half, half)}, 1)});
      });
  return {tables.select(0, 0), tables.select(0, 1)};
}

std::vector<at::Tensor> Dinov3BackboneImpl::forward(const at::Tensor& pixel_values) const {
  const int64_t B = pixel_values.size(0), p = config.patch_size;
  const int64_t h = pixel_values.size(2) / p, w = pixel_values.size(3) / p;
  const at::Tensor patches =
      patch_embeddings->forward_patches(pixel_values).flatten(2).transpose(1, 2);
  at::Tensor x =
      at::cat({cls_token.expand({B, -1, -1}), register_tokens.expand({B, -1, -1}), patches}, 1);
  const RopeTables rope = rope_tables(h, w, pixel_values.scalar_type());
  const int64_t prefix = 1 + config.num_register_tokens;
  std::vector<at::Tensor> out;
  size_t next = 0;  // the next out_indices entry
  // Each block leaves its output pending for the next one's first LayerNorm (forward_pending);
  // an out stage sums it once, and the next block takes that sum.
  layers::PendingResidual pending{x};
  for (int64_t stage = 0; stage <= config.num_layers && next < config.out_indices.size(); ++stage) {
    if (stage > 0) pending = blocks[stage - 1]->forward_pending(pending, rope);
    if (stage != config.out_indices[next]) continue;
    ++next;
    x = pending.sum();
    pending = {x};
    const at::Tensor s =
        stage == config.num_layers || config.apply_layernorm ? norm->forward(x) : x;
    out.push_back(s.slice(1, prefix).reshape({B, h, w, s.size(2)}).permute({0, 3, 1, 2}));
  }
  return out;
}

SpatialTuningAdapterImpl::SpatialTuningAdapterImpl(const rtdetr::Config& c, int64_t inplanes) {
  using layers::Activation;
  stem_conv_ =
      register_module("stem_conv", rtdetr::conv_norm(c, 3, inplanes, 3, 2, Activation::gelu));
  conv2_ = register_module("conv2",
                           rtdetr::conv_norm(c, inplanes, 2 * inplanes, 3, 2, Activation::none));
  conv3_ = register_module(
      "conv3", rtdetr::conv_norm(c, 2 * inplanes, 4 * inplanes, 3, 2, Activation::none));
  conv4_ = register_module(
      "conv4", rtdetr::conv_norm(c, 4 * inplanes, 4 * inplanes, 3, 2, Activation::none));
  // No weights: the name is no checkpoint key.
  pool_ = register_module("stem_pool",
                          std::make_shared<layers::MaxPool2dImpl>(layers::square_pool(3, 2, 1)));
}

std::vector<at::Tensor> SpatialTuningAdapterImpl::forward(const at::Tensor& pixel_values) const {
  const at::Tensor h1 = pool_->forward(stem_conv_->forward(pixel_values));
  const at::Tensor h2 = conv2_->forward(h1);
  const at::Tensor h3 = conv3_->forward(layers::activate(layers::Activation::gelu, h2));
  const at::Tensor h4 = conv4_->forward(layers::activate(layers::Activation::gelu, h3));
  return {h2, h3, h4};
}

Dinov3ConvEncoderImpl::Dinov3ConvEncoderImpl(const rtdetr::Config& c, const Dinov3Config& b) {
  backbone_ = register_module("backbone", make<Dinov3BackboneImpl>(b));
  adapter_ = register_module("spatial_tuning_adapter",
                             make<SpatialTuningAdapterImpl>(c, b.adapter_inplanes));
  const int64_t e = c.encoder_hidden_dim, d = b.hidden_size, a = b.adapter_inplanes;
  std::vector<layers::ConvNorm> proj;
  for (const int64_t channels : {d + 2 * a, d + 4 * a, d + 4 * a})
    proj.push_back(rtdetr::conv_norm(c, channels, e, 1, 1, layers::Activation::none));
  fusion_proj_ = layers::register_list(*this, "fusion_proj", proj);
}

void Dinov3ConvEncoderImpl::prepare() { backbone_->prepare(); }

std::vector<at::Tensor> Dinov3ConvEncoderImpl::forward(const at::Tensor& pixel_values) const {
  const int64_t H = pixel_values.size(2), W = pixel_values.size(3);
  if (H % 32 != 0 || W % 32 != 0)
    throw std::invalid_argument(c10::str(
        "deimv2: a ", H, "x", W,
        " input: the DINOv3 encoder needs sides that are multiples of 32 (its backbone and "
        "spatial tuning adapter maps differ in size otherwise)"));
  const auto maps = backbone_->forward(pixel_values);
  const auto details = adapter_->forward(pixel_values);
  const int64_t p = backbone_->config.patch_size, h = H / p, w = W / p;
  const int64_t scales = static_cast<int64_t>(maps.size());
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < scales && i < static_cast<int64_t>(details.size()); ++i) {
    // int(height_patches * 2 ** (num_scales - 2 - i)): truncation of the float product.
    const double f = std::pow(2.0, static_cast<double>(scales - 2 - i));
    const auto rh = static_cast<int64_t>(static_cast<double>(h) * f);
    const auto rw = static_cast<int64_t>(static_cast<double>(w) * f);
    // On CUDA the map in the memory format of the adapter's map it is concatenated with
    // (channels_last under the layout): one copy, which also gives upsample_bilinear2d its
    // channels-last kernel (one thread per output element; the contiguous kernel loops over
    // batch x channels in each thread and took 4.8 of DEIMv2-S's 24.5 ms at batch 32,
    // docs/BENCHMARKS.md) and the concatenation one format. (Not fusion_proj's 1x1 weight: ATen
    // calls a (O, I, 1, 1) tensor channels_last either way.) On the CPU upstream's .contiguous():
    // ATen's CPU bilinear kernel rounds otherwise on channels_last input. An unchanged size is
    // upsample_bilinear2d's own copy: the map itself.
    const at::Tensor map = maps[i].contiguous(maps[i].is_cuda() ? details[i].suggest_memory_format()
                                                                : at::MemoryFormat::Contiguous);
    const at::Tensor semantic =
        rh == h && rw == w ? map : at::upsample_bilinear2d(map, {rh, rw}, /*align_corners=*/false);
    out.push_back(fusion_proj_[i]->forward(at::cat({semantic, details[i]}, 1)));
  }
  return out;
}

}  // namespace libreyolo::models::deimv2
