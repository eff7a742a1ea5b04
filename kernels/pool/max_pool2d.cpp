#include "kernels/pool/max_pool2d.h"

#include <c10/util/Exception.h>

#include "kernels/pool/max_pool2d_problem.h"

namespace libreyolo::kernels {

int64_t max_pool2d_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride,
                               int64_t dilation, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  // div_rtn: floor for a negative span too (an empty output, refused by the caller's check).
  int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

at::Tensor max_pool2d_portable(const at::Tensor& input, const PoolGeometry& g) {
  return at::max_pool2d(input, {g.kernel_h, g.kernel_w}, {g.stride_h, g.stride_w},
                        {g.pad_h, g.pad_w}, {g.dilation_h, g.dilation_w}, g.ceil_mode);
}

std::optional<std::string> max_pool2d_problem(const at::Tensor& input, const PoolGeometry& g) {
  if (!input.defined() || input.dim() != 4)
    return "input must be (B, C, H, W), got " +
           (input.defined() ? c10::str(input.sizes()) : std::string("an undefined tensor"));
  // PyTorch's pool2d_shape_check: only the batch may be empty.
  if (input.size(1) < 1 || input.size(2) < 1 || input.size(3) < 1)
    return "input must have non-zero C, H and W, got " + c10::str(input.sizes());
  if (g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.dilation_h < 1 ||
      g.dilation_w < 1)
    return std::string("kernel, stride and dilation must be >= 1");
  // PyTorch's check (aten/src/ATen/native/Pool.h pool2d_shape_check): kernel / 2, undilated.
  if (g.pad_h < 0 || g.pad_w < 0 || g.pad_h > g.kernel_h / 2 || g.pad_w > g.kernel_w / 2)
    return std::string("padding must be >= 0 and at most half the kernel size");
  const int64_t oh = max_pool2d_output_size(input.size(2), g.kernel_h, g.pad_h, g.stride_h,
                                            g.dilation_h, g.ceil_mode);
  const int64_t ow = max_pool2d_output_size(input.size(3), g.kernel_w, g.pad_w, g.stride_w,
                                            g.dilation_w, g.ceil_mode);
  if (oh < 1 || ow < 1)
    return "the input " + c10::str(input.sizes()) + " is smaller than one pooling window";
  return std::nullopt;
}

at::Tensor max_pool2d(const MaxPool2dHandle& handle, const at::Tensor& input,
                      const PoolGeometry& g) {
  if (const auto problem = max_pool2d_problem(input, g))
    TORCH_CHECK(false, "max_pool2d: ", *problem);
  if (!handle.empty()) {
    if (auto out = handle(input, g)) return std::move(*out);
  }
  return max_pool2d_portable(input, g);
}

}  // namespace libreyolo::kernels
