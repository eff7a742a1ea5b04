// PP-DocLayoutV2's reading-order transformer (modular_pp_doclayout_v2.py, transformers 5.17:
// PPDocLayoutV2ReadingOrder, PPDocLayoutV2TextEmbeddings, PPDocLayoutV2ReadingOrderEncoder /
// Layer / SelfAttention, PPDocLayoutV2PositionRelationEmbedding, PPDocLayoutV2GlobalPointer).

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "models/pp_doclayout_v2/modules.h"

namespace libreyolo::models::pp_doclayout_v2 {
namespace {

at::Tensor embedding_table(torch::nn::Module& parent, const std::string& name, int64_t rows,
                           int64_t width) {
  auto m = parent.register_module(name, std::make_shared<torch::nn::Module>());
  return m->register_parameter("weight", at::empty({rows, width}));
}

}  // namespace

ReadingOrderConfig ReadingOrderConfig::parse(const core::ConfigView& r) {
  ReadingOrderConfig c;
  auto positive = [&r](const char* field, int64_t fallback) {
    const int64_t v = r.get_int(field, fallback);
    if (v <= 0) r.fail(field, "must be positive, found " + std::to_string(v));
    return v;
  };
  c.hidden_size = positive("hidden_size", c.hidden_size);
  c.num_attention_heads = positive("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = positive("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = positive("num_hidden_layers", c.num_hidden_layers);
  try {
    c.hidden_act = layers::activation_from_name(r.get_string("hidden_act", "gelu"));
  } catch (const std::invalid_argument& e) {
    r.fail("hidden_act", e.what());
  }
  c.layer_norm_eps = r.get_double("layer_norm_eps", c.layer_norm_eps);
  if (r.get_bool("has_relative_attention_bias", false))
    r.fail("has_relative_attention_bias",
           "true is not supported (transformers 5.17 computes the 1-D relative bias from "
           "position_ids its encoder is never given, and fails)");
  c.has_spatial_attention_bias = r.get_bool("has_spatial_attention_bias", true);
  c.max_position_embeddings = positive("max_position_embeddings", c.max_position_embeddings);
  c.max_2d_position_embeddings =
      positive("max_2d_position_embeddings", c.max_2d_position_embeddings);
  c.type_vocab_size = positive("type_vocab_size", c.type_vocab_size);
  c.vocab_size = positive("vocab_size", c.vocab_size);
  c.coordinate_size = positive("coordinate_size", c.coordinate_size);
  c.shape_size = positive("shape_size", c.shape_size);
  c.num_classes = positive("num_classes", c.num_classes);
  c.relation_bias_embed_dim = positive("relation_bias_embed_dim", c.relation_bias_embed_dim);
  c.relation_bias_theta = r.get_double("relation_bias_theta", c.relation_bias_theta);
  c.relation_bias_scale = r.get_double("relation_bias_scale", c.relation_bias_scale);
  c.global_pointer_head_size = positive("global_pointer_head_size", c.global_pointer_head_size);
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size", "must be divisible by num_attention_heads");
  if (c.relation_bias_embed_dim % 2 != 0) r.fail("relation_bias_embed_dim", "must be even");
  // Box coordinates and sides on the [0, 1000] scale index the 2-D tables.
  if (c.max_2d_position_embeddings <= 1000)
    r.fail("max_2d_position_embeddings", "must exceed 1000 (boxes are on a [0, 1000] scale)");
  for (auto [field, v] : {std::pair<const char*, int64_t*>{"start_token_id", &c.start_token_id},
                          {"pad_token_id", &c.pad_token_id},
                          {"end_token_id", &c.end_token_id},
                          {"pred_token_id", &c.pred_token_id}}) {
    if (r.has(field) && r.raw(field).is_null())
      r.fail(field, "must be a token id (null fails upstream)");
    *v = r.get_int(field, *v);
    if (*v < 0 || *v >= c.vocab_size)
      r.fail(field, "must be in [0, vocab_size " + std::to_string(c.vocab_size) + ")");
  }
  return c;
}

ReadingOrderImpl::ReadingOrderImpl(const ReadingOrderConfig& c) : config_(c) {
  const int64_t h = c.hidden_size;
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  word_ = embedding_table(*embeddings, "word_embeddings", c.vocab_size, h);
  token_type_ = embedding_table(*embeddings, "token_type_embeddings", c.type_vocab_size, h);
  position_ = embedding_table(*embeddings, "position_embeddings", c.max_position_embeddings, h);
  const int64_t rows = c.max_2d_position_embeddings;
  x_ = embedding_table(*embeddings, "x_position_embeddings", rows, c.coordinate_size);
  y_ = embedding_table(*embeddings, "y_position_embeddings", rows, c.coordinate_size);
  h_ = embedding_table(*embeddings, "h_position_embeddings", rows, c.shape_size);
  w_ = embedding_table(*embeddings, "w_position_embeddings", rows, c.shape_size);
  norm_ = embeddings->register_module("norm",
                                      std::make_shared<layers::LayerNormImpl>(h, c.layer_norm_eps));
  spatial_proj_ = embeddings->register_module(
      "spatial_proj",
      std::make_shared<layers::LinearImpl>(4 * c.coordinate_size + 2 * c.shape_size, h));
  label_ = embedding_table(*this, "label_embeddings", c.num_classes, h);
  label_projection_ =
      register_module("label_features_projection", std::make_shared<layers::LinearImpl>(h, h));

  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  // Upstream's attention is softmax(q / sqrt(d) @ k^T + bias) with CogView's PB-Relax
  // rescaling: the same softmax up to rounding (8e-7 on the fixture's order logits).
  layers::BertConfig bert;
  bert.hidden_size = h, bert.num_attention_heads = c.num_attention_heads;
  bert.intermediate_size = c.intermediate_size, bert.layer_norm_eps = c.layer_norm_eps;
  bert.act = c.hidden_act;
  std::vector<std::shared_ptr<layers::BertLayerImpl>> ls;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    ls.push_back(std::make_shared<layers::BertLayerImpl>(bert, "norm"));
  layers_ = layers::register_list(*encoder, "layer", ls);
  // Built whether or not has_spatial_attention_bias (upstream's module exists either way).
  auto relation =
      encoder->register_module("rel_bias_module", std::make_shared<torch::nn::Module>());
  layers::Conv2dOptions po;
  po.in = 4 * c.relation_bias_embed_dim, po.out = c.num_attention_heads, po.bias = true;
  pos_proj_ = relation->register_module("pos_proj", std::make_shared<layers::Conv2dImpl>(po));
  auto head = register_module("relative_head", std::make_shared<torch::nn::Module>());
  pointer_ = head->register_module(
      "dense", std::make_shared<layers::LinearImpl>(h, 2 * c.global_pointer_head_size));
}

at::Tensor ReadingOrderImpl::relation_bias(const at::Tensor& boxes) const {
  // _cal_2d_pos_emb: corners -> (cx, cy, w, h), sides at least 1e-3.
  const at::Tensor x0 = boxes.select(-1, 0), y0 = boxes.select(-1, 1), x1 = boxes.select(-1, 2),
                   y1 = boxes.select(-1, 3);
  const at::Tensor cwh = at::stack(
      {(x0 + x1) * 0.5, (y0 + y1) * 0.5, (x1 - x0).clamp_min(1e-3), (y1 - y0).clamp_min(1e-3)}, -1);
  // box_relative_encoding (epsilon 1e-5): source i (rows) against target j (columns).
  const double eps = 1e-5;
  const at::Tensor src = cwh.unsqueeze(-2), tgt = cwh.unsqueeze(-3);
  const at::Tensor src_wh = src.narrow(-1, 2, 2) + eps;
  const at::Tensor rel_xy =
      at::log((src.narrow(-1, 0, 2) - tgt.narrow(-1, 0, 2)).abs() / src_wh + 1.0);
  const at::Tensor rel_wh = at::log(src_wh / (tgt.narrow(-1, 2, 2) + eps));
  const at::Tensor rel = at::cat({rel_xy, rel_wh}, -1);  // (B, L, L, 4)
  // get_position_embedding: inv_freq = 1 / theta^(2i / (dim / 2)) (float32, as the buffer),
  // [sin | cos] per coordinate, flattened coordinate-major.
  const int64_t dim = config_.relation_bias_embed_dim;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(boxes.device());
  const at::Tensor inv_freq = at::reciprocal(at::pow(
      config_.relation_bias_theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim / 2)));
  const at::Tensor angle = (rel * config_.relation_bias_scale).unsqueeze(-1) * inv_freq;
  const at::Tensor embedding =
      at::cat({angle.sin(), angle.cos()}, -1).flatten(-2).to(boxes.scalar_type());
  return pos_proj_->forward(embedding.permute({0, 3, 1, 2}));
}

at::Tensor ReadingOrderImpl::forward(const at::Tensor& boxes, const at::Tensor& labels,
                                     const at::Tensor& mask) const {
  const int64_t B = mask.size(0), N = mask.size(1), L = N + 2;
  const auto dev = boxes.device();
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(dev);
  const at::Tensor kept = mask.sum(1).to(at::kLong).unsqueeze(1);  // (B, 1)
  // Tokens: start, one "pred" per kept detection, end, padding.
  const at::Tensor col = at::arange(L, i64).unsqueeze(0);
  at::Tensor ids = at::full({B, L}, config_.pad_token_id, i64);
  ids = at::where(col == 0, config_.start_token_id, ids);
  ids = at::where((col >= 1) & (col <= kept), config_.pred_token_id, ids);
  ids = at::where(col == kept + 1, config_.end_token_id, ids);
  // create_position_ids_from_input_ids: padding_idx + running count of non-padding tokens.
  const at::Tensor real = ids.ne(config_.pad_token_id).to(at::kInt);
  const at::Tensor positions =
      (real.cumsum(1).to(at::kInt) * real).to(at::kLong) + config_.pad_token_id;

  const at::Tensor pad = at::zeros({B, 1, 4}, boxes.options());
  const at::Tensor padded = at::cat({pad, boxes, pad}, 1);  // (B, L, 4)
  const at::Tensor b = padded.to(at::kLong);                // truncation, as .long()
  const at::Tensor x0 = b.select(-1, 0), y0 = b.select(-1, 1), x1 = b.select(-1, 2),
                   y1 = b.select(-1, 3);
  const at::Tensor spatial = at::cat(
      {at::embedding(x_, x0), at::embedding(y_, y0), at::embedding(x_, x1), at::embedding(y_, y1),
       at::embedding(h_, (y1 - y0).clamp(0, 1023)), at::embedding(w_, (x1 - x0).clamp(0, 1023))},
      -1);
  at::Tensor e = at::embedding(word_, ids) + at::embedding(token_type_, at::zeros_like(ids));
  e = e + at::embedding(position_, positions);
  e = e + spatial_proj_->forward(spatial);
  const at::Tensor label_pad = at::zeros({B, 1, e.size(-1)}, e.options());
  e = e +
      at::cat({label_pad, label_projection_->forward(at::embedding(label_, labels)), label_pad}, 1);
  at::Tensor x = norm_->forward(e);

  // Additive key mask: start, the kept detections and end attend; finfo.min elsewhere.
  const at::Tensor valid = (col < kept + 2).view({B, 1, 1, L});
  at::Tensor bias = at::where(valid, at::zeros({}, e.options()),
                              at::full({}, layers::finfo_min(e.scalar_type()), e.options()));
  if (config_.has_spatial_attention_bias) bias = relation_bias(padded) + bias;
  for (const auto& layer : layers_) x = layer->forward(x, bias);
  return pp_doclayout_v3::global_pointer_logits(pointer_->forward(x.narrow(1, 1, N)),
                                                config_.global_pointer_head_size);
}

}  // namespace libreyolo::models::pp_doclayout_v2
