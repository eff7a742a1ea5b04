#include "models/layers/bert_model.h"

#include <c10/util/StringUtil.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace libreyolo::models::layers {

double finfo_min(at::ScalarType dtype) {
  if (dtype == at::kHalf) return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
  if (dtype == at::kBFloat16)
    return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
  return static_cast<double>(std::numeric_limits<float>::lowest());
}

BertConfig parse_bert_config(const core::ConfigView& v) {
  BertConfig c;
  v.get_enum("model_type", "bert", {"bert"});
  c.vocab_size = v.get_int("vocab_size", c.vocab_size);
  c.hidden_size = v.get_int("hidden_size", c.hidden_size);
  c.num_hidden_layers = v.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = v.get_int("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = v.get_int("intermediate_size", c.intermediate_size);
  c.max_position_embeddings = v.get_int("max_position_embeddings", c.max_position_embeddings);
  c.type_vocab_size = v.get_int("type_vocab_size", c.type_vocab_size);
  c.layer_norm_eps = v.get_double("layer_norm_eps", c.layer_norm_eps);
  v.get_enum("position_embedding_type", "absolute", {"absolute"});
  if (v.get_bool("is_decoder", false)) v.fail("is_decoder", "only the BERT encoder is supported");
  try {
    c.act = layers::activation_from_name(v.get_string("hidden_act", "gelu"));
  } catch (const std::invalid_argument& e) {
    v.fail("hidden_act", e.what());
  }
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0 ||
      c.hidden_size % c.num_attention_heads != 0)
    v.fail("num_attention_heads", "must divide hidden_size");
  if (c.vocab_size < 1) v.fail("vocab_size", "must be positive");
  if (c.max_position_embeddings < 1) v.fail("max_position_embeddings", "must be positive");
  if (c.type_vocab_size < 1) v.fail("type_vocab_size", "must be positive");
  return c;
}

BertLayerImpl::BertLayerImpl(const BertConfig& c, const std::string& norm_name) : act(c.act) {
  const int64_t d = c.hidden_size;
  auto attention_parent = register_module("attention", std::make_shared<torch::nn::Module>());
  layers::AttentionOptions o;
  o.embed_dim = d;
  o.num_heads = c.num_attention_heads;
  o.q_name = "query";
  o.k_name = "key";
  o.v_name = "value";
  o.o_name = "";
  attention = attention_parent->register_module("self", std::make_shared<layers::AttentionImpl>(o));
  auto attention_output =
      attention_parent->register_module("output", std::make_shared<torch::nn::Module>());
  attention_out =
      attention_output->register_module("dense", std::make_shared<layers::LinearImpl>(d, d));
  attention_norm = attention_output->register_module(
      norm_name, std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
  auto inter = register_module("intermediate", std::make_shared<torch::nn::Module>());
  intermediate =
      inter->register_module("dense", std::make_shared<layers::LinearImpl>(d, c.intermediate_size));
  auto out = register_module("output", std::make_shared<torch::nn::Module>());
  output =
      out->register_module("dense", std::make_shared<layers::LinearImpl>(c.intermediate_size, d));
  output_norm =
      out->register_module(norm_name, std::make_shared<layers::LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor BertLayerImpl::forward(const at::Tensor& x, const at::Tensor& bias) const {
  const auto a =
      attention_norm->forward(attention_out->forward(attention->forward(x, x, x, bias)) + x);
  const auto h = layers::activate(act, intermediate->forward(a));
  return output_norm->forward(output->forward(h) + a);
}

BertModelImpl::BertModelImpl(const BertConfig& c) : config(c) {
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  auto table = [&](const char* name, int64_t rows) {
    auto m = embeddings->register_module(name, std::make_shared<torch::nn::Module>());
    return m->register_parameter("weight", at::empty({rows, c.hidden_size}));
  };
  word_embeddings = table("word_embeddings", c.vocab_size);
  position_embeddings = table("position_embeddings", c.max_position_embeddings);
  token_type_embeddings = table("token_type_embeddings", c.type_vocab_size);
  embeddings_norm = embeddings->register_module(
      "LayerNorm", std::make_shared<layers::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  std::vector<std::shared_ptr<BertLayerImpl>> ls;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    ls.push_back(std::make_shared<BertLayerImpl>(c));
  encoder_layers = layers::register_list(*encoder, "layer", ls);
}

namespace {

/// Throws std::invalid_argument unless every id of `ids` is in [0, rows).
void check_ids(const at::Tensor& ids, int64_t rows, const char* name) {
  if (ids.numel() == 0) return;
  const auto lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= rows)
    throw std::invalid_argument(
        c10::str("bert: ", name, " must be in [0, ", rows, "), got [", lo, ", ", hi, "]"));
}

}  // namespace

at::Tensor BertModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                                  const at::Tensor& position_ids,
                                  const at::Tensor& attention_mask) const {
  if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
    throw std::invalid_argument(c10::str("bert: input_ids must be (B, L) int64, got ",
                                         input_ids.sizes(), " ", input_ids.scalar_type()));
  const int64_t B = input_ids.size(0), L = input_ids.size(1);
  const auto device = word_embeddings.device();
  const auto ids = input_ids.to(device);
  const auto types = token_type_ids.defined() ? token_type_ids.to(device) : at::zeros_like(ids);
  const auto positions = position_ids.defined()
                             ? position_ids.to(device)
                             : at::arange(L, ids.options()).unsqueeze(0).expand({B, L});
  check_ids(ids, config.vocab_size, "input_ids");
  check_ids(types, config.type_vocab_size, "token_type_ids");
  check_ids(positions, config.max_position_embeddings, "position_ids");
  auto x = at::embedding(word_embeddings, ids) + at::embedding(token_type_embeddings, types);
  x = embeddings_norm->forward(x + at::embedding(position_embeddings, positions));
  at::Tensor bias;
  if (attention_mask.defined()) {
    // transformers' bidirectional mask: 0 where attended, the dtype's lowest value elsewhere.
    auto allowed = attention_mask.to(device).to(at::kBool);
    allowed = allowed.dim() == 2 ? allowed.view({B, 1, 1, L}) : allowed.unsqueeze(1);
    bias = at::zeros(allowed.sizes(), x.options())
               .masked_fill(allowed.logical_not(), finfo_min(x.scalar_type()));
  }
  for (const auto& layer : encoder_layers) x = layer->forward(x, bias);
  return x;
}

}  // namespace libreyolo::models::layers
