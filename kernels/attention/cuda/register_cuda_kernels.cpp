// Entry point of the in-tree CUDA provider (kernels/builtin.cpp's "cuda" provider).
#include <ATen/cuda/CUDAContext.h>

#include "kernels/registry.h"

namespace libreyolo::kernels {

void register_ms_deform_attn_cuda(Registry& registry);   // attention/cuda/ms_deform_attn_cuda.cpp
void register_fake_quant_fp8_cuda(Registry& registry);   // quant/cuda/fake_quant_fp8_cuda.cpp
void register_conv2d_bias_act_cuda(Registry& registry);  // conv/cuda/conv2d_bias_act_cuda.cpp
void register_conv2d_bias_act_cudnn_graph(Registry& registry);     // conv/cuda/*_cudnn_graph.cpp
void register_conv2d_bias_act_cuda_depthwise(Registry& registry);  // conv/cuda/depthwise_*.cpp
void register_max_pool2d_cuda(Registry& registry);                 // pool/cuda/max_pool2d_cuda.cpp
void register_add_layer_norm_cuda(Registry& registry);    // norm/cuda/add_layer_norm_cuda.cpp
void register_linear_act_cuda(Registry& registry);        // gemm/cuda/linear_act_cuda.cpp
void register_fp8_gemm_cuda(Registry& registry);          // gemm/cuda/fp8_gemm_cuda.cpp
void register_image_preprocess_cuda(Registry& registry);  // image/cuda/image_preprocess_cuda.cpp
void register_flash_attention_cuda(Registry& registry);   // attention/cuda/flash_attention_cuda.cpp
void register_sampling_locations_cuda(
    Registry& registry);                              // attention/cuda/sampling_locations_cuda.cpp
void register_refine_boxes_cuda(Registry& registry);  // box/cuda/refine_boxes_cuda.cpp
void register_rotary_embedding_cuda(
    Registry& registry);  // attention/cuda/rotary_embedding_cuda.cpp

/// The provider's capability check: a CUDA device this process can use.
bool cuda_device_usable() { return at::cuda::is_available(); }

/// Registers every `cuda` implementation.
void register_cuda_kernels(Registry& registry) {
  register_ms_deform_attn_cuda(registry);
  register_sampling_locations_cuda(registry);
  register_refine_boxes_cuda(registry);
  register_rotary_embedding_cuda(registry);
  register_fake_quant_fp8_cuda(registry);
  register_conv2d_bias_act_cuda(registry);
  // The newest registration is tried first: depthwise convolutions reach cuda_depthwise, what it
  // declines reaches cudnn_graph (16-bit, fused epilogue), and what that declines reaches `cuda`.
  register_conv2d_bias_act_cudnn_graph(registry);
  register_conv2d_bias_act_cuda_depthwise(registry);
  register_max_pool2d_cuda(registry);
  register_add_layer_norm_cuda(registry);
  register_linear_act_cuda(registry);
  register_fp8_gemm_cuda(registry);
  register_image_preprocess_cuda(registry);
  // After the built-in attention implementations: tried before mem_efficient and sdpa.
  register_flash_attention_cuda(registry);
}

}  // namespace libreyolo::kernels
