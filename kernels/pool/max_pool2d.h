// The `max_pool2d` slot: y = max over each pooling window of x (nn.MaxPool2d in eval mode, no
// indices), the stem pooling of the ResNet and HGNetV2 backbones.
//
// Implementations: the portable path (at::max_pool2d), `cpu`
// (kernels/pool/cpu/max_pool2d_cpu.cpp) and `cuda` (kernels/pool/cuda/max_pool2d_cuda.h), both
// channels_last only. ATen's CUDA max_pool2d always
// computes the argmax indices as well (aten/src/ATen/native/MaxPooling.cpp calls
// max_pool2d_with_indices off the CPU), writing an int64 map four times the size of a bfloat16
// output (its cost in an RT-DETR-R50 forward: docs/BENCHMARKS.md, "Against torch.compile,
// third run").
//
// Shapes and dtypes:
//   input   (B, C, H, W)  float32 / float16 / bfloat16, any memory format
//   output  (B, C, H', W') in input's dtype and memory format; H', W' as nn.MaxPool2d
//           (max_pool2d_output_size)
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// nn.MaxPool2d's parameters (per axis: height, width). Padding is implicit -infinity.
struct PoolGeometry {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
};

/// The slot's declaration.
inline constexpr SlotDef<at::Tensor(const at::Tensor& input, const PoolGeometry& geometry)>
    kMaxPool2d{"max_pool2d"};
using MaxPool2dHandle = Handle<decltype(kMaxPool2d)::Signature>;

/// Output length of one axis, PyTorch's formula (aten/src/ATen/native/Pool.h
/// pooling_output_shape): floor or ceil of (in + 2 pad - dilation (kernel - 1) - 1) / stride,
/// plus one; with ceil_mode the last window must start inside the input or its left padding.
int64_t max_pool2d_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride,
                               int64_t dilation, bool ceil_mode);

/// The model-facing entry point: validates (c10::Error naming the problem: input not 4-D or
/// with an empty C, H or W,
/// kernel / stride / dilation < 1, padding above half the
/// kernel, an empty output), calls
/// `handle`, and runs max_pool2d_portable when the handle is empty or every candidate declined.
at::Tensor max_pool2d(const MaxPool2dHandle& handle, const at::Tensor& input,
                      const PoolGeometry& geometry);

/// at::max_pool2d with these parameters.
at::Tensor max_pool2d_portable(const at::Tensor& input, const PoolGeometry& geometry);

}  // namespace libreyolo::kernels
