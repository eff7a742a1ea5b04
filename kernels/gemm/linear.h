// The `linear` slot: y = x W^T + b, every Linear layer that is not followed by a fused
// activation (attention projections, FFN second layers, heads: layers::LinearImpl::forward).
//
// Implementations: none by default (the portable path is at::linear, with no slot call at all
// when the handle is empty: CUDA models pay nothing), and `onednn` (kernels/gemm/cpu/
// linear_act_onednn.cpp): bfloat16 models on CPUs with native bf16 (AVX-512 BF16 or AMX), oneDNN's
// inner product on a weight packed once into its blocked format. Why: at::linear on a bfloat16
// CPU tensor is oneDNN's matmul on the plain weight, which reorders the weight on every call:
// 0.76 ms against 0.50 ms packed for RT-DETR's 8,400 x 256 x 256 encoder projections (2 threads,
// AMX Xeon, 2026-12-05); in RT-DETR-R18's bfloat16 forward the GEMMs went from 12.8 to 10.5 ms
// (bench-models --profile), and whole forwards gained 1-4 ms of 60-140, within that machine's
// noise (docs/BENCHMARKS.md).
// float32 models do not bind it: they keep at::linear's (MKL sgemm's) numbers bit for bit.
//
// Shapes and dtypes:
//   x       (..., K)  the model's dtype
//   weight  (N, K), x's dtype and device
//   bias    (N) or undefined
//   output  (..., N) in x's dtype
#pragma once

#include <ATen/ATen.h>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The slot's declaration.
inline constexpr SlotDef<at::Tensor(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias)>
    kLinear{"linear"};
using LinearHandle = Handle<decltype(kLinear)::Signature>;

/// The model-facing entry point: `handle` when bound and it serves the call, else at::linear
/// (whose errors name a shape mismatch: c10::Error).
inline at::Tensor linear(const LinearHandle& handle, const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& bias) {
  if (!handle.empty()) {
    if (auto out = handle(x, weight, bias)) return std::move(*out);
  }
  return at::linear(x, weight, bias);
}

}  // namespace libreyolo::kernels
