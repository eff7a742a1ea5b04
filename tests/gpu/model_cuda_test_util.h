// Helpers of the model tests on CUDA against the transformers CPU fixtures (RT-DETR, D-FINE):
// TF32 off, the fixture's input, and the process registry's record of ms_deform_attn's `cuda`
// implementation. Header-only.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::test {

/// TF32 off for cuDNN and cuBLAS: cuDNN convolutions default to TF32 on Hopper (hf-models.md 9),
/// which the CPU reference does not use.
inline void disable_tf32() {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
}

/// The fixture's pixel_u8 times preprocessor_config.json's rescale_factor (float32, CPU): the
/// input of the families whose processor does not normalise.
inline at::Tensor rescaled_fixture_pixels(const std::string& dir) {
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto pre = models::core::read_json_file(dir + "/preprocessor_config.json");
  const float rescale = static_cast<float>(pre.at("rescale_factor").get<double>());
  return expected->view("pixel_u8").to(at::kFloat) * rescale;
}

/// Calls of ms_deform_attn's `cuda` implementation so far, and whether a failure disabled it.
inline std::pair<uint64_t, bool> cuda_msda_state() {
  const auto c =
      candidate_report(kernels::Registry::process_default(), kernels::kMsDeformAttn.name, "cuda");
  return {c.calls, c.disabled};
}

/// Whether ms_deform_attn's `cuda` implementation is selected in this process.
inline bool cuda_msda_selected() {
  const auto names = kernels::Registry::process_default().iter_impls(kernels::kMsDeformAttn.name);
  return std::find(names.begin(), names.end(), "cuda") != names.end();
}

}  // namespace libreyolo::test
