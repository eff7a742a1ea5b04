// The handles a model is bound to at load (kernelize-style): every slot the families call,
// resolved once for the model's device, dtype and kernel policy (kernels::Registry::bind), and
// the interface through which modules receive them.
#pragma once

#include <torch/nn/module.h>

#include "kernels/attention/dot_product_attention.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/attention/rotary_embedding.h"
#include "kernels/attention/sampling_locations.h"
#include "kernels/box/refine_boxes.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/gemm/fp8_gemm.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/registry.h"

namespace libreyolo::models::layers {

/// One handle per slot. Default-constructed handles are empty: the portable paths run (what a
/// module does before it is bound, e.g. in a unit test that builds it alone).
struct BoundKernels {
  kernels::MsDeformAttnHandle ms_deform_attn;
  kernels::SamplingLocationsHandle sampling_locations;
  kernels::RefineBoxesHandle refine_boxes;
  kernels::RotaryEmbeddingHandle rotary_embedding;
  kernels::AttentionHandle attention;
  kernels::Conv2dBiasActHandle conv2d_bias_act;
  kernels::MaxPool2dHandle max_pool2d;
  kernels::AddLayerNormHandle add_layer_norm;
  kernels::LinearActHandle linear_act;
  kernels::LinearHandle linear;
  /// Bound only for a model loaded with `quantization: fp8` (models/load_model.cpp), empty
  /// otherwise; the quantised layers hold it (models/quantization/fp8.h).
  kernels::Fp8GemmHandle fp8_gemm;
};

/// Implemented by every module that calls a slot: takes the handles it needs. Called once at
/// load, before the first forward (not thread-safe with forward()).
class UsesKernels {
 public:
  virtual ~UsesKernels() = default;
  virtual void bind_kernels(const BoundKernels& kernels) = 0;
};

/// Binds every slot for `context` from `registry` with `filter` (the process filter overridden
/// by the model's serving.yaml lists), gives the handles to every UsesKernels module of `root`'s
/// tree (root included) and returns them. Throws std::logic_error only for an undeclared slot
/// (a build error, not an input error).
BoundKernels bind_kernels(torch::nn::Module& root, kernels::Registry& registry,
                          const kernels::BindContext& context, const kernels::Filter& filter);

}  // namespace libreyolo::models::layers
