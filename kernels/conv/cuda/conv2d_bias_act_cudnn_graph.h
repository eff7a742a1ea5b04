// The `cudnn_graph` implementation of conv2d_bias_act
// (kernels/conv/cuda/conv2d_bias_act_cudnn_graph.cpp): what its tests reach besides the binding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

#include "kernels/activation.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/slot.h"

namespace libreyolo::kernels::cuda {

/// True when the implementation was built (cudnn-frontend's headers were found).
bool cudnn_graph_built();

/// The fused graph for this one call, untimed and not cached: heuristic A's first buildable
/// engine config, run once (the fused numerics whatever the timing would decide). Shapes as
/// kernels/conv/conv2d_bias_act.h; declines what the implementation declines, and "cuDNN has no
/// engine for this graph".
Outcome<at::Tensor> conv2d_bias_act_cudnn_graph_untimed(const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const at::Tensor& bias,
                                                        const at::Tensor& residual,
                                                        const ConvGeometry& g, Activation act);

/// Geometries tuned so far in this process, and how many of them the fused graph serves.
struct CudnnGraphTuned {
  std::size_t geometries = 0, fused = 0;
};
CudnnGraphTuned cudnn_graph_tuned();

}  // namespace libreyolo::kernels::cuda
