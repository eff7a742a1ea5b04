// RT-DETR / RT-DETRv2 on CUDA against the transformers CPU fixtures (skips without a GPU).
// TF32 is switched off first: cuDNN convolutions default to TF32 on Hopper (hf-models.md 9),
// which the CPU reference does not use.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/model.h"
#include "tests/gpu/model_cuda_test_util.h"

namespace {

namespace core = libreyolo::models::core;

using libreyolo::test::cuda_msda_selected;
using libreyolo::test::cuda_msda_state;

class RTDetrCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(RTDetrCuda, MatchesCpuReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  libreyolo::test::disable_tf32();
  const std::string dir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + GetParam();
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto pixels = libreyolo::test::rescaled_fixture_pixels(dir);
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    libreyolo::models::LoadOptions options;
    options.dtype = dtype;
    options.device = at::Device(at::kCUDA, 0);
    const auto model = libreyolo::models::load_model(dir, options);
    const auto [calls_before, disabled_before] = cuda_msda_state();
    at::InferenceMode guard;  // as the daemon runs: inference tensors everywhere
    const auto out = model->forward(pixels.to(options.device, dtype));
    // The bilinear families must run the in-tree kernel, not silently fall back (RT-DETRv2
    // `discrete` stays portable by design).
    const auto [calls_after, disabled_after] = cuda_msda_state();
    EXPECT_FALSE(disabled_after) << "ms_deform_attn/cuda was disabled by a runtime failure";
    if (cuda_msda_selected() && GetParam() != "rtdetr_v2_tiny_discrete") {
      EXPECT_GT(calls_after, calls_before) << "the model did not call ms_deform_attn/cuda";
    }
    (void)disabled_before;
    ASSERT_TRUE(out.logits.is_cuda());
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    const double dl = (out.logits.cpu() - expected->view("logits")).abs().max().item<double>();
    const double db =
        (out.pred_boxes.cpu() - expected->view("pred_boxes")).abs().max().item<double>();
    std::cout << "[gpu] " << GetParam() << " " << c10::toString(dtype)
              << ": max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db << std::endl;
    if (dtype == at::kFloat) {
      EXPECT_LE(dl, 1e-4);
      EXPECT_LE(db, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RTDetrCuda,
                         ::testing::Values("rtdetr_tiny", "rtdetr_tiny_basic", "rtdetr_v2_tiny",
                                           "rtdetr_v2_tiny_discrete"),
                         [](const auto& info) { return info.param; });

}  // namespace
