// The geometry checks of the `max_pool2d` slot (kernels/pool/max_pool2d.h), shared by its entry
// point and its implementations. A header of its own: max_pool2d.h reaches most of models/.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "kernels/pool/max_pool2d.h"

namespace libreyolo::kernels {

/// What makes `geometry` unable to pool `input`, as the sentence the slot entry throws after
/// "max_pool2d: " (input not 4-D or with an empty C, H or W; kernel, stride or dilation < 1;
/// padding negative or above half the kernel, PyTorch's pool2d_shape_check; an empty output),
/// or nothing. The implementations decline what it names, so that a direct call of a handle
/// neither divides by a zero stride nor indexes past an empty output.
std::optional<std::string> max_pool2d_problem(const at::Tensor& input,
                                              const PoolGeometry& geometry);

}  // namespace libreyolo::kernels
