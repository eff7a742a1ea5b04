// Weight quantisation at load (serving.yaml `quantization: fp8`): the Linear layers of a model's
// transformer blocks keep an FP8 (E4M3FN) copy of their weight, one float32 scale per output
// channel (kernels/gemm/fp8_gemm.h quantize_fp8_weight), and run through the `fp8_gemm` slot
// (at::_scaled_mm on GPUs with FP8 tensor cores); everything else (convolutions, prediction
// heads, deformable sampling offsets) stays in the model's dtype.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/gemm/fp8_gemm.h"
#include "models/quantization/quantization.h"

namespace torch::nn {
class Module;
}

namespace libreyolo::models::quantization {

/// What quantize_fp8 did to a model (shown per model in /active).
struct Fp8Report {
  int layers = 0;          ///< Linear layers and packed q/k/v projections now in FP8
  int kept_shape = 0;      ///< targets kept dense: K or N not a multiple of 16 (FP8 GEMMs' rule)
  int64_t parameters = 0;  ///< weight elements quantised
};

/// Whether the Linear at `path` (its dotted module name, transformers' parameter prefix) is an
/// FP8 target: a projection or MLP of a transformer block (a path segment `layer`, `layers` or
/// `blocks`, as transformers names its block lists: ViT `encoder.layer.N`, Swin
/// `encoder.layers.N.blocks.M`, DETR `decoder.layers.N`), and not a prediction head or a
/// sampling predictor, whose outputs are boxes and locations rather than features (no segment
/// containing `embed`, `head`, `predictor`, `lqe`, `classifier`, `reference_point`,
/// `sampling_offsets` or `attention_weights`: RT-DETR's `decoder.bbox_embed.N.layers.M`,
/// YOLOS's `bbox_predictor.layers.M`, D-FINE's `lqe_layers`, deformable attention's offsets).
/// The heads are a few per cent of the FLOPs; FP8 there would move boxes for nothing.
bool fp8_target(const std::string& path);

/// Gives every target Linear of `root` (fp8_target; the root's own children by their names) an
/// FP8 copy of its weight and `handle`, and every attention module with packed q/k/v
/// projections under a target path one for its in_proj_weight. Does nothing when `handle` is
/// empty (no implementation can serve the model: the report is all zeros). Call once, after
/// the layouts and before the first forward. Throws c10::Error for a weight holding a
/// non-finite value (kernels::quantize_fp8_weight).
Fp8Report quantize_fp8(torch::nn::Module& root, const kernels::Fp8GemmHandle& handle);

}  // namespace libreyolo::models::quantization
