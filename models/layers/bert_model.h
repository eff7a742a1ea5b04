// BERT's encoder without the pooler (transformers 5.17 models/bert/modeling_bert.py BertModel with
// add_pooling_layer=False): the text tower of Grounding DINO / MM Grounding DINO, a module that
// any text-conditioned family can register under its on-disk prefix ("model.text_backbone").
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layers/attention.h"
#include "models/layers/layers.h"

namespace libreyolo::models::layers {

/// BertConfig fields the encoder reads.
struct BertConfig {
  int64_t vocab_size = 30522, hidden_size = 768, num_hidden_layers = 12, num_attention_heads = 12;
  int64_t intermediate_size = 3072, max_position_embeddings = 512, type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  layers::Activation act = layers::Activation::gelu;
};

/// torch.finfo(dtype).min of a floating dtype (float32, float16, bfloat16): the additive bias
/// transformers puts on masked attention scores.
double finfo_min(at::ScalarType dtype);

/// Reads a BertConfig (config.json's text_config). Throws core::ConfigError naming the field:
/// model_type other than "bert", position_embedding_type other than "absolute", is_decoder,
/// heads not dividing hidden_size, hidden_act unknown.
BertConfig parse_bert_config(const core::ConfigView& v);

/// One BertLayer: self-attention (attention.self.{query,key,value}, attention.output.dense +
/// LayerNorm), intermediate.dense + act, output.dense + LayerNorm; post-norm residuals.
class BertLayerImpl : public torch::nn::Module {
 public:
  /// `norm_name`: the two LayerNorms' child name (PP-DocLayoutV2's reading-order layers, which
  /// are LayoutLMv3's = BERT's, call them "norm").
  explicit BertLayerImpl(const BertConfig& c, const std::string& norm_name = "LayerNorm");
  /// x (B, L, D), bias additive (B, 1, L, L) or undefined -> (B, L, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias) const;

  layers::Attention attention;
  layers::Linear attention_out, intermediate, output;
  layers::LayerNorm attention_norm, output_norm;
  layers::Activation act;
};

/// BertModel (no pooler), on-disk children embeddings.{word,position,token_type}_embeddings,
/// embeddings.LayerNorm, encoder.layer.{i}.*.
class BertModelImpl : public torch::nn::Module {
 public:
  explicit BertModelImpl(const BertConfig& c);

  /// input_ids (B, L) int64 in [0, vocab_size), token_type_ids (B, L) int64 or undefined
  /// (zeros), position_ids (B, L) int64 in [0, max_position_embeddings) or undefined
  /// (0..L-1), attention_mask (B, L, L) bool (true = may attend; Grounding DINO's per-phrase
  /// mask) or (B, L) (1 = token) or undefined (all). Returns last_hidden_state (B, L, D) in the
  /// model's dtype. Embeddings as upstream: (word + token_type) + position, LayerNorm.
  /// Throws std::invalid_argument for ids out of range (naming the tensor).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                     const at::Tensor& position_ids, const at::Tensor& attention_mask) const;

  BertConfig config;
  at::Tensor word_embeddings, position_embeddings, token_type_embeddings;
  layers::LayerNorm embeddings_norm;
  std::vector<std::shared_ptr<BertLayerImpl>> encoder_layers;
};

}  // namespace libreyolo::models::layers
