// CUDA test artifact of the hub provider (GPU machine): the in-tree CUDA ms_deform_attn kernels
// (kernels/attention/cuda/) behind the Hub op schemas, registered for the CUDA dispatch key only,
// as kernels-community/deformable-detr's torch_binding.cpp does. Built when CUDA is enabled.
#include <torch/library.h>

#include <vector>

#include "kernels/attention/cuda/ms_deform_attn_cuda.h"

#define HUBTEST_CAT2(a, b) a##b
#define HUBTEST_CAT(a, b) HUBTEST_CAT2(a, b)
// Expands TORCH_EXTENSION_NAME before TORCH_LIBRARY pastes it (kernel-builder's
// TORCH_LIBRARY_EXPAND).
#define HUBTEST_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define HUBTEST_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

extern "C" void* PyModule_Create2(void* module_def, int api_version);

extern "C" __attribute__((visibility("default"))) void* HUBTEST_CAT(PyInit_,
                                                                    TORCH_EXTENSION_NAME)() {
  return PyModule_Create2(nullptr, 3);
}

namespace {

at::Tensor forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                   const at::Tensor& level_start_index, const at::Tensor& sampling_loc,
                   const at::Tensor& attn_weight, int64_t /*im2col_step*/) {
  TORCH_CHECK(value.is_cuda(), "hub CUDA test op: value must be a CUDA tensor");
  return libreyolo::kernels::cuda::ms_deform_attn_forward(value, spatial_shapes, level_start_index,
                                                          sampling_loc, attn_weight);
}

std::vector<at::Tensor> backward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                 const at::Tensor& level_start_index,
                                 const at::Tensor& sampling_loc, const at::Tensor& attn_weight,
                                 const at::Tensor& grad_output, int64_t /*im2col_step*/) {
  auto [gv, gl, ga] = libreyolo::kernels::cuda::ms_deform_attn_backward(
      value, spatial_shapes, level_start_index, sampling_loc, attn_weight, grad_output);
  return {gv, gl, ga};
}

}  // namespace

HUBTEST_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def(
      "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_loc, Tensor attn_weight, int im2col_step) -> Tensor");
  m.def(
      "ms_deform_attn_backward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_loc, Tensor attn_weight, Tensor grad_output, int im2col_step) -> Tensor[]");
}

HUBTEST_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CUDA, m) {
  m.impl("ms_deform_attn_forward", &forward);
  m.impl("ms_deform_attn_backward", &backward);
}
