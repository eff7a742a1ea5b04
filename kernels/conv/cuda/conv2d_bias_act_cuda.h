// The `cuda` implementation of conv2d_bias_act (kernels/conv/cuda/conv2d_bias_act_cuda.cpp),
// declared for the implementation that measures itself against it (`cudnn_graph`,
// kernels/conv/cuda/conv2d_bias_act_cudnn_graph.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/activation.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/slot.h"

namespace libreyolo::kernels::cuda {

/// act(conv2d(input, weight) + bias + residual) on CUDA: ReLU through ATen's
/// cudnn_convolution_relu / cudnn_convolution_add_relu, every other activation as
/// at::cudnn_convolution without bias followed by one epilogue kernel (bias_act_cuda.h).
/// Shapes and dtypes as kernels/conv/conv2d_bias_act.h. Declines CPU tensors, dtypes other than
/// float32 / float16 / bfloat16, autograd, a bias or residual of another dtype, and (the
/// epilogue) a device where the kernel failed its check against ATen.
Outcome<at::Tensor> conv2d_bias_act_cuda(const at::Tensor& input, const at::Tensor& weight,
                                         const at::Tensor& bias, const at::Tensor& residual,
                                         const ConvGeometry& g, Activation act);

}  // namespace libreyolo::kernels::cuda
