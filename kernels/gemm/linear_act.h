// The `linear_act` slot: y = act(x W^T + b), a transformer MLP's first Linear and its activation
// (fc1 + GELU in the ViT backbones of RF-DETR, LW-DETR, DEIMv2's DINOv3 and the ViT/DeiT
// classifiers).
//
// Implementations: the portable path (below: at::linear, then the activation, two kernels and
// one extra pass over the (tokens, 4 D) activations), `onednn` (kernels/gemm/cpu/
// linear_act_onednn.cpp; CPU float32 models: oneDNN's inner product on a weight packed once, ReLU
// and the erf GELU as exact post-ops), and `cublaslt`
// (kernels/gemm/cuda/linear_act_cuda.cpp): the activation and bias in the GEMM's epilogue
// (at::_addmm_activation, cuBLASLt's CUBLASLT_EPILOGUE_GELU_BIAS or RELU_BIAS; aten/src/ATen/
// native/cuda/Blas.cpp). ReLU is exact; the GELU epilogue computes the tanh form, at most 4.7e-4
// from the exact erf form (at |x| = 2.7, where the output is 2.69): `cublaslt` takes float16 and
// bfloat16 only, whose rounding there (half an ulp: 9.8e-4 and 7.8e-3) is larger, and declines
// float32, which keeps transformers' exact numbers. GELU after the RF-DETR medium backbone's fc1
// was 1.02 of 10.15 ms of a batch-32 forward on an H200 (docs/BENCHMARKS.md, 2026-12-04).
//
// Shapes and dtypes:
//   x       (..., K)  float32 / float16 / bfloat16
//   weight  (N, K), x's dtype and device
//   bias    (N) or undefined
//   output  (..., N) in x's dtype
#pragma once

#include <ATen/ATen.h>

#include "kernels/activation.h"
#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration.
inline constexpr SlotDef<at::Tensor(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias, Activation act)>
    kLinearAct{"linear_act"};
using LinearActHandle = Handle<decltype(kLinearAct)::Signature>;

/// The model-facing entry point: validates (c10::Error naming the tensor: x of no dimension,
/// weight not (N, K), bias not (N)), calls `handle`, and runs linear_act_portable when the
/// handle is empty or every candidate declined.
at::Tensor linear_act(const LinearActHandle& handle, const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, Activation act);

/// at::linear, then apply_activation (kernels/conv/conv2d_bias_act.h; gelu: the erf form): the
/// unfused modules' ops, bit for bit.
at::Tensor linear_act_portable(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, Activation act);

/// The entries of `onednn`'s packed-weight table (live weights and freed ones not yet swept):
/// for tests of its reuse.
size_t linear_act_onednn_packed_weights();

}  // namespace libreyolo::kernels
