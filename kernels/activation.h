// The activations a fused kernel can apply after a convolution or a linear layer: the subset of
// transformers' ACT2FN the families use (gelu is the exact erf form). No torch dependency, so
// that slot signatures and policies can name them.
#pragma once

namespace libreyolo::kernels {

enum class Activation { none, relu, silu, gelu, tanh };

/// "none" | "relu" | "silu" | "gelu" | "tanh".
const char* activation_name(Activation act);

}  // namespace libreyolo::kernels
