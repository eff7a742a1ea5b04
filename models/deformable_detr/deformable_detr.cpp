// DeformableDetrForObjectDetection (transformers 5.17), inference only. Forward pass as in
// hf-models.md 5.4; every step keeps transformers' operation order so that float32 results match.

#include "models/module_model.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

#include "models/core/config.h"
#include "models/core/pixel_mask.h"
#include "models/core/safetensors.h"
#include "models/core/state_dict.h"
#include "models/deformable_detr/geometry.h"
#include "models/deformable_detr/input_proj.h"
#include "models/deformable_detr/ms_deform_attention.h"
#include "models/deformable_detr/resnet.h"
#include "models/layers/attention.h"
#include "models/layers/gather_rows.h"
#include "models/layers/layers.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace deformable_detr {
namespace {

using layers::Activation;

struct Config {
  int64_t d_model = 256, encoder_layers = 6, decoder_layers = 6;
  int64_t encoder_heads = 8, decoder_heads = 8, encoder_ffn = 1024, decoder_ffn = 1024;
  int64_t num_queries = 300, num_levels = 4, encoder_points = 4, decoder_points = 4;
  int64_t num_proposals = 300, num_labels = 2;
  bool two_stage = false, with_box_refine = false;
  Activation act = Activation::relu;
  ResNetConfig backbone;
  std::map<int64_t, std::string> id2label;
};

Config parse_config(const core::ConfigView& v) {
  Config c;
  c.d_model = v.get_int("d_model", 256);
  c.encoder_layers = v.get_int("encoder_layers", 6);
  c.decoder_layers = v.get_int("decoder_layers", 6);
  c.encoder_heads = v.get_int("encoder_attention_heads", 8);
  c.decoder_heads = v.get_int("decoder_attention_heads", 8);
  c.encoder_ffn = v.get_int("encoder_ffn_dim", 1024);
  c.decoder_ffn = v.get_int("decoder_ffn_dim", 1024);
  c.num_queries = v.get_int("num_queries", 300);
  c.num_levels = v.get_int("num_feature_levels", 4);
  c.encoder_points = v.get_int("encoder_n_points", 4);
  c.decoder_points = v.get_int("decoder_n_points", 4);
  c.num_proposals = v.get_int("two_stage_num_proposals", 300);
  c.two_stage = v.get_bool("two_stage", false);
  c.with_box_refine = v.get_bool("with_box_refine", false);
  try {
    c.act = layers::activation_from_name(v.get_string("activation_function", "relu"));
  } catch (const std::invalid_argument& e) {
    v.fail("activation_function", e.what());
  }
  c.id2label = v.id2label();
  c.num_labels =
      c.id2label.empty() ? v.get_int("num_labels", 2) : static_cast<int64_t>(c.id2label.size());
  v.get_enum("position_embedding_type", "sine", {"sine"});
  if (v.get_bool("dilation", false)) v.fail("dilation", "dilated backbones are not supported");
  if (v.get_bool("use_timm_backbone", false) || !v.has("backbone_config"))
    v.fail("backbone_config",
           "only the Hugging Face ResNet backbone (use_timm_backbone false, "
           "backbone_config.model_type \"resnet\") is supported");
  const auto bc = v.child("backbone_config");
  bc.get_enum("model_type", "", {"resnet"});
  c.backbone = parse_resnet_config(
      bc, c.num_levels > 1 ? std::vector<int64_t>{2, 3, 4} : std::vector<int64_t>{4});
  if (c.d_model <= 0 || c.d_model % 32 != 0)
    v.fail("d_model", "must be a positive multiple of 32 (GroupNorm(32, d_model))");
  if (c.encoder_heads <= 0 || c.d_model % c.encoder_heads != 0)
    v.fail("encoder_attention_heads", "must divide d_model");
  if (c.decoder_heads <= 0 || c.d_model % c.decoder_heads != 0)
    v.fail("decoder_attention_heads", "must divide d_model");
  if (c.decoder_layers < 1) v.fail("decoder_layers", "must be at least 1");
  if (c.num_levels < static_cast<int64_t>(c.backbone.out_indices.size()))
    v.fail("num_feature_levels", "fewer levels than backbone feature maps");
  if (c.two_stage && !c.with_box_refine)
    v.fail("two_stage", "two_stage requires with_box_refine (transformers validation)");
  if (c.two_stage && c.num_proposals < 1) v.fail("two_stage_num_proposals", "must be positive");
  if (!c.two_stage && c.num_queries < 1) v.fail("num_queries", "must be positive");
  return c;
}

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

/// DeformableDetrEncoderLayer (post-norm).
class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const Config& c) : act(c.act) {
    self_attn = register_module(
        "self_attn", make<MultiscaleDeformableAttentionImpl>(c.d_model, c.encoder_heads,
                                                             c.num_levels, c.encoder_points));
    self_attn_layer_norm =
        register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    fc1 = register_module("fc1", make<layers::LinearImpl>(c.d_model, c.encoder_ffn));
    fc2 = register_module("fc2", make<layers::LinearImpl>(c.encoder_ffn, c.d_model));
    final_layer_norm =
        register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& mask,
                     const at::Tensor& ref, const kernels::SpatialShapes& shapes) const {
    auto h = x + self_attn->forward(x, pos, x, mask, ref, shapes);
    h = self_attn_layer_norm->forward(h);
    h = h + fc2->forward(fc1->forward_act(h, act));
    return final_layer_norm->forward(h);
  }
  MultiscaleDeformableAttention self_attn;
  layers::LayerNorm self_attn_layer_norm, final_layer_norm;
  layers::Linear fc1, fc2;
  Activation act;
};

/// DeformableDetrDecoderLayer (post-norm): self-attention, deformable cross-attention, FFN.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const Config& c) : act(c.act) {
    layers::AttentionOptions o;
    o.embed_dim = c.d_model;
    o.num_heads = c.decoder_heads;
    self_attn = register_module("self_attn", make<layers::AttentionImpl>(o));
    self_attn_layer_norm =
        register_module("self_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    encoder_attn = register_module(
        "encoder_attn", make<MultiscaleDeformableAttentionImpl>(c.d_model, c.decoder_heads,
                                                                c.num_levels, c.decoder_points));
    encoder_attn_layer_norm =
        register_module("encoder_attn_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
    fc1 = register_module("fc1", make<layers::LinearImpl>(c.d_model, c.decoder_ffn));
    fc2 = register_module("fc2", make<layers::LinearImpl>(c.decoder_ffn, c.d_model));
    final_layer_norm =
        register_module("final_layer_norm", make<layers::LayerNormImpl>(c.d_model, 1e-5));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& query_pos, const at::Tensor& ref,
                     const at::Tensor& memory, const at::Tensor& memory_mask,
                     const kernels::SpatialShapes& shapes) const {
    const auto qk = x + query_pos;
    auto h = x + self_attn->forward(qk, qk, x);
    h = self_attn_layer_norm->forward(h);
    h = h + encoder_attn->forward(h, query_pos, memory, memory_mask, ref, shapes);
    h = encoder_attn_layer_norm->forward(h);
    h = h + fc2->forward(fc1->forward_act(h, act));
    return final_layer_norm->forward(h);
  }
  layers::Attention self_attn;
  MultiscaleDeformableAttention encoder_attn;
  layers::LayerNorm self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm;
  layers::Linear fc1, fc2;
  Activation act;
};

/// inverse_sigmoid(ref) added to the first 2 (2-d refs) or all 4 coordinates of `delta`.
at::Tensor add_reference(const at::Tensor& delta, const at::Tensor& ref) {
  const auto inv = layers::inverse_sigmoid(ref);
  if (ref.size(-1) == 4) return delta + inv;
  return at::cat({delta.slice(-1, 0, 2) + inv, delta.slice(-1, 2)}, -1);
}

/// The module tree with the on-disk names ("model.*", "class_embed.*", "bbox_embed.*").
class DeformableDetrImpl : public torch::nn::Module {
 public:
  explicit DeformableDetrImpl(const Config& c) : config(c) {
    const int64_t d = c.d_model;
    auto model = register_module("model", make<torch::nn::Module>());
    auto backbone_parent = model->register_module("backbone", make<torch::nn::Module>());
    auto conv_encoder = backbone_parent->register_module("conv_encoder", make<torch::nn::Module>());
    backbone = conv_encoder->register_module("model", make<ResNetBackboneImpl>(c.backbone));
    const auto channels = backbone->channels();
    std::vector<std::shared_ptr<InputProjImpl>> projs;
    for (size_t l = 0; l < channels.size(); ++l)
      projs.push_back(make<InputProjImpl>(channels[l], d, false));
    int64_t in = channels.back();
    for (auto l = static_cast<int64_t>(channels.size()); l < c.num_levels; ++l) {
      projs.push_back(make<InputProjImpl>(in, d, true));
      in = d;
    }
    input_proj = layers::register_list(*model, "input_proj", projs);
    level_embed = model->register_parameter("level_embed", at::empty({c.num_levels, d}));
    if (c.two_stage) {
      enc_output = model->register_module("enc_output", make<layers::LinearImpl>(d, d));
      enc_output_norm =
          model->register_module("enc_output_norm", make<layers::LayerNormImpl>(d, 1e-5));
      pos_trans = model->register_module("pos_trans", make<layers::LinearImpl>(2 * d, 2 * d));
      pos_trans_norm =
          model->register_module("pos_trans_norm", make<layers::LayerNormImpl>(2 * d, 1e-5));
    } else {
      auto qpe = model->register_module("query_position_embeddings", make<torch::nn::Module>());
      query_position_embeddings =
          qpe->register_parameter("weight", at::empty({c.num_queries, 2 * d}));
      reference_points = model->register_module("reference_points", make<layers::LinearImpl>(d, 2));
    }
    auto encoder = model->register_module("encoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<EncoderLayerImpl>> el;
    for (int64_t i = 0; i < c.encoder_layers; ++i) el.push_back(make<EncoderLayerImpl>(c));
    encoder_layers = layers::register_list(*encoder, "layers", el);
    auto decoder = model->register_module("decoder", make<torch::nn::Module>());
    std::vector<std::shared_ptr<DecoderLayerImpl>> dl;
    for (int64_t i = 0; i < c.decoder_layers; ++i) dl.push_back(make<DecoderLayerImpl>(c));
    decoder_layers = layers::register_list(*decoder, "layers", dl);
    const int64_t num_pred = c.decoder_layers + (c.two_stage ? 1 : 0);
    std::vector<layers::Linear> ce;
    std::vector<layers::MLP> be;
    for (int64_t i = 0; i < num_pred; ++i) {
      ce.push_back(make<layers::LinearImpl>(d, c.num_labels));
      be.push_back(make<layers::MLPImpl>(d, d, 4, 3, Activation::relu));
    }
    class_embed = layers::register_list(*this, "class_embed", ce);
    bbox_embed = layers::register_list(*this, "bbox_embed", be);
  }

  /// pixel_values (B, 3, H, W), pixel_mask (B, H, W) (nonzero = valid).
  /// Returns logits (B, Q, num_labels) and pred_boxes (B, Q, 4) of the last decoder layer.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& pixel_values,
                                            const at::Tensor& pixel_mask) const {
    const auto dtype = pixel_values.scalar_type();
    const int64_t d = config.d_model;
    const auto features = backbone->forward(pixel_values);
    const auto mask_input = pixel_mask.unsqueeze(0);
    auto level_mask = [&](const at::Tensor& source, at::ScalarType t) {
      return at::upsample_nearest2d(mask_input.to(t), {source.size(2), source.size(3)})
          .to(at::kBool)
          .squeeze(0);
    };
    std::vector<at::Tensor> sources, masks, positions;
    for (size_t l = 0; l < features.size(); ++l) {
      sources.push_back(input_proj[l]->forward(features[l]));
      masks.push_back(level_mask(features[l], at::kFloat));
    }
    for (size_t l = features.size(); l < static_cast<size_t>(config.num_levels); ++l) {
      const auto source =
          input_proj[l]->forward(l == features.size() ? features.back() : sources.back());
      sources.push_back(source);
      masks.push_back(level_mask(source, dtype));
    }
    kernels::SpatialShapes shapes;
    std::vector<at::Tensor> source_flat, mask_flat, pos_flat, ratios;
    for (size_t l = 0; l < sources.size(); ++l) {
      const auto& s = sources[l];
      shapes.push_back({s.size(2), s.size(3)});
      const auto pos = sine_position_embedding(masks[l], d / 2, dtype).to(s.scalar_type());
      source_flat.push_back(s.flatten(2).transpose(1, 2));
      pos_flat.push_back(pos.flatten(2).transpose(1, 2) +
                         level_embed.select(0, static_cast<int64_t>(l)).view({1, 1, -1}));
      mask_flat.push_back(masks[l].flatten(1));
    }
    const auto source = at::cat(source_flat, 1);
    const auto mask = at::cat(mask_flat, 1);
    const auto lvl_pos = at::cat(pos_flat, 1);
    for (const auto& m : masks) ratios.push_back(valid_ratio(m, source.scalar_type()));
    const auto valid_ratios = at::stack(ratios, 1);  // (B, L, 2)

    // Encoder.
    const auto enc_ref = encoder_reference_points(shapes, valid_ratios);
    at::Tensor memory = source;
    for (const auto& layer : encoder_layers)
      memory = layer->forward(memory, lvl_pos, mask, enc_ref, shapes);

    // Queries and initial reference points.
    const int64_t B = memory.size(0);
    at::Tensor query_pos, target, ref;
    if (config.two_stage) {
      const auto S = memory.size(1);
      if (config.num_proposals > S)
        throw std::invalid_argument(c10::str(
            "deformable_detr: two_stage_num_proposals = ", config.num_proposals, " exceeds the ", S,
            " encoder tokens of a ", pixel_values.size(2), "x", pixel_values.size(3), " input"));
      auto [masked, proposals] = encoder_output_proposals(memory, mask.logical_not(), shapes);
      const auto object_query = enc_output_norm->forward(enc_output->forward(masked));
      const auto enc_class = class_embed.back()->forward(object_query);
      const auto topk = std::get<1>(at::topk(enc_class.select(-1, 0), config.num_proposals, 1));
      // The box head on the selected tokens only (upstream runs it on all S and gathers): it is
      // row-wise, so the gathered rows are the same.
      const auto topk_coords = bbox_embed.back()->forward(layers::gather_rows(object_query, topk)) +
                               layers::gather_rows(proposals, topk);
      ref = topk_coords.sigmoid();
      const auto pos_trans_out = pos_trans_norm->forward(
          pos_trans->forward(proposal_position_embedding(topk_coords, d / 2)));
      query_pos = pos_trans_out.slice(2, 0, d);
      target = pos_trans_out.slice(2, d);
    } else {
      query_pos = query_position_embeddings.slice(1, 0, d).unsqueeze(0).expand({B, -1, -1});
      target = query_position_embeddings.slice(1, d).unsqueeze(0).expand({B, -1, -1});
      ref = reference_points->forward(query_pos).sigmoid();
    }

    // Decoder; `ref` ends as the reference of the last layer's input (heads use it).
    at::Tensor h = target;
    const auto ratios4 = at::cat({valid_ratios, valid_ratios}, -1);
    const auto n = decoder_layers.size();
    for (size_t i = 0; i < n; ++i) {
      const auto ref_in = ref.size(-1) == 4 ? ref.unsqueeze(2) * ratios4.unsqueeze(1)
                                            : ref.unsqueeze(2) * valid_ratios.unsqueeze(1);
      h = decoder_layers[i]->forward(h, query_pos, ref_in, memory, mask, shapes);
      if (config.with_box_refine && i + 1 < n)
        ref = add_reference(bbox_embed[i]->forward(h), ref).sigmoid();
    }
    const auto logits = class_embed[n - 1]->forward(h);
    const auto boxes = add_reference(bbox_embed[n - 1]->forward(h), ref).sigmoid();
    return {logits, boxes};
  }

  Config config;
  std::shared_ptr<ResNetBackboneImpl> backbone;
  std::vector<std::shared_ptr<InputProjImpl>> input_proj;
  at::Tensor level_embed, query_position_embeddings;
  layers::Linear reference_points, enc_output, pos_trans;
  layers::LayerNorm enc_output_norm, pos_trans_norm;
  std::vector<std::shared_ptr<EncoderLayerImpl>> encoder_layers;
  std::vector<std::shared_ptr<DecoderLayerImpl>> decoder_layers;
  std::vector<layers::Linear> class_embed;
  std::vector<layers::MLP> bbox_embed;
};

class DeformableDetrModel : public ModuleModel<DeformableDetrImpl> {
 public:
  DeformableDetrModel(std::shared_ptr<DeformableDetrImpl> net, const LoadOptions& options)
      : ModuleModel("deformable_detr", Task::object_detection, std::move(net), options) {}

  ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor& pixel_mask) const override {
    const at::Tensor x = checked_input(pixel_values, net_->config.backbone.num_channels);
    const at::Tensor mask =
        core::checked_pixel_mask("deformable_detr", x, pixel_mask, options_.device);
    auto [logits, boxes] = net_->forward(x, mask);
    ModelOutput out;
    out.logits = logits.to(at::kFloat);
    out.pred_boxes = boxes.to(at::kFloat);
    return out;
  }
};

/// hf-models.md 1.3: `H.i.*` -> `model.decoder.H.i.*`, then index 0 for tied heads.
core::LoadRules head_rules(const Config& c) {
  core::LoadRules rules;
  const bool tie_class = !c.two_stage, tie_bbox = !c.with_box_refine;
  rules.aliases = [tie_class, tie_bbox](const std::string& key) {
    static const std::regex re(R"((class_embed|bbox_embed)\.(\d+)\.(.*))");
    std::smatch m;
    std::vector<std::string> out;
    if (!std::regex_match(key, m, re)) return out;
    const std::string head = m[1], index = m[2], rest = m[3];
    out.push_back("model.decoder." + head + "." + index + "." + rest);
    const bool tied = head == "class_embed" ? tie_class : tie_bbox;
    if (tied && index != "0") {
      out.push_back(head + ".0." + rest);
      out.push_back("model.decoder." + head + ".0." + rest);
    }
    return out;
  };
  return rules;
}

}  // namespace
}  // namespace deformable_detr

namespace {

/// Default of the decoder self-attention modules' `fused_attn` flag, decided by measurement
/// (tests/parity/fused_attention_policy_test.cpp): SDPA only where it is byte-exact with the
/// manual math on the deformable_detr_tiny fixture. It is not: manual. (Multi-scale deformable
/// attention is a kernel slot, not affected by the flag.)
constexpr bool kFusedAttentionDefault = false;

/// Loads `dir`/model.safetensors for config.json `model_type` "deformable_detr" (`config` is the
/// parsed config.json). Head keys follow hf-models.md 1.3: `class_embed.i` / `bbox_embed.i`,
/// else `model.decoder.{class,bbox}_embed.i`, else (tied heads only: class heads without
/// two_stage, box heads without with_box_refine) index 0. Throws core::ConfigError /
/// core::CheckpointError (std::runtime_error) naming the file and the field or tensor key;
/// unsupported options (timm backbone, learned position embedding, dilation) are ConfigErrors.
std::unique_ptr<Model> load_deformable_detr(const std::string& dir, const nlohmann::json& config,
                                            const LoadOptions& options) {
  const core::ConfigView view(config, dir + "/config.json");
  const auto c = deformable_detr::parse_config(view);
  auto net = std::make_shared<deformable_detr::DeformableDetrImpl>(c);
  const auto file = core::SafetensorsFile::open(dir + "/model.safetensors");
  core::load_state_dict(*net, *file, deformable_detr::head_rules(c), options.dtype, options.device);
  layers::set_fused_attention(*net, kFusedAttentionDefault);
  return std::make_unique<deformable_detr::DeformableDetrModel>(std::move(net), options);
}

// Deformable DETR (Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End Object
// Detection", ICLR 2021) as transformers 5.17 DeformableDetrForObjectDetection
// (models/deformable_detr/modeling_deformable_detr.py) with the Hugging Face ResNet backbone
// (`backbone_config.model_type == "resnet"`, frozen BatchNorm), including iterative box
// refinement (`with_box_refine`) and the two-stage variant (`two_stage`). forward() takes
// pixel_values (B, 3, H, W) and an optional pixel_mask (B, H, W); it returns logits
// (B, num_queries, num_labels) and pred_boxes (B, num_queries, 4), float32.
const FamilyRegistrar registered{
    Family{"deformable_detr", {"deformable_detr"}, /*order=*/20, load_deformable_detr}
        .predicts({Task::object_detection}, image::DetectionHead::deformable_detr)
        .takes_pixel_mask()
        .fused_attention(kFusedAttentionDefault)
        .layouts({{"batchnorm_fold", {"ResNetShortCut"}, "", path_with("shortcut")},
                  {"batchnorm_fold", {"ResNetConvLayer"}},
                  {"qkv_concat", {"DeformableDetrSelfAttention"}}},
                 {"repvgg", "batchnorm_fold", "avgpool_fold", "qkv_concat", "channels_last"})};

}  // namespace
}  // namespace libreyolo::models
