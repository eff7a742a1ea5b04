// Entry point of the in-tree CUDA provider (called by kernels/builtin.cpp's "cuda" provider).
#include "kernels/registry.h"

namespace libreyolo::kernels {

void register_ms_deform_attn_cuda(Registry& registry);  // attention/cuda/ms_deform_attn_cuda.cpp
void register_fake_quant_fp8_cuda(Registry& registry);  // quant/cuda/fake_quant_fp8_cuda.cpp

/// Registers every `cuda` implementation: ms_deform_attn and fake_quant_fp8.
void register_cuda_kernels(Registry& registry) {
  register_ms_deform_attn_cuda(registry);
  register_fake_quant_fp8_cuda(registry);
}

}  // namespace libreyolo::kernels
