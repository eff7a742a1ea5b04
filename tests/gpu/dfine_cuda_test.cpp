// D-FINE on CUDA against the transformers CPU fixture (skips without a GPU). TF32 is switched
// off first: cuDNN convolutions default to TF32 on Hopper (hf-models.md 9), which the CPU
// reference does not use. The fixture's ragged points per level ([3, 6, 3]) must still reach
// the `cuda` ms_deform_attn kernel (padded to the classic layout by the D-FINE decoder).
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
#include "models/runtime/cuda_graph_runner.h"
#include "tests/gpu/model_cuda_test_util.h"

namespace {

namespace core = libreyolo::models::core;

using libreyolo::test::cuda_msda_selected;
using libreyolo::test::cuda_msda_state;

/// max |ours - ref| over (B, Q, 4 + C) rows of [pred_boxes, logits], after pairing every reference
/// query with its nearest row of ours. The dfine_tiny fixture's smallest gap between consecutive
/// encoder top-k scores is 1.2e-6 (meta.json), the size of CPU-vs-CUDA differences: two adjacent
/// queries may swap places, which permutes the output rows (the decoder is equivariant to the
/// query order) without changing any detection. A swap at the top-k boundary (another query
/// selected) is still caught: no row of ours is then near the dropped one. `bijective` is false
/// when two reference rows pair with the same row of ours.
double matched_max_diff(const at::Tensor& logits, const at::Tensor& boxes, const at::Tensor& ref_l,
                        const at::Tensor& ref_b, bool& bijective) {
  const auto ours = at::cat({boxes, logits}, -1).cpu().to(at::kDouble);
  const auto ref = at::cat({ref_b, ref_l}, -1).cpu().to(at::kDouble);
  // d[b, i, j] = max_k |ours[b, i, k] - ref[b, j, k]|
  const auto d = (ours.unsqueeze(2) - ref.unsqueeze(1)).abs().amax(-1);
  const auto [best, idx] = d.min(1);  // nearest row of ours for each reference row
  bijective = true;
  for (int64_t b = 0; b < idx.size(0); ++b)
    bijective = bijective && std::get<0>(at::_unique(idx[b])).numel() == idx.size(1);
  return best.max().item<double>();
}

TEST(DFineCuda, MatchesCpuReferenceAndUsesTheCudaKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  libreyolo::test::disable_tf32();
  const std::string dir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/dfine_tiny";
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto pixels = libreyolo::test::rescaled_fixture_pixels(dir);
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (bool fused : {false, true}) {
      if (dtype != at::kFloat && fused) continue;
      libreyolo::models::LoadOptions options;
      options.dtype = dtype;
      options.device = at::Device(at::kCUDA, 0);
      const auto model = libreyolo::models::load_model(dir, options);
      EXPECT_EQ(model->set_fused_attention(fused), fused ? 3 : 0);
      const auto [calls_before, disabled_before] = cuda_msda_state();
      at::InferenceMode guard;  // as the daemon runs: inference tensors everywhere
      const auto out = model->forward(pixels.to(options.device, dtype));
      const auto [calls_after, disabled_after] = cuda_msda_state();
      EXPECT_FALSE(disabled_after) << "ms_deform_attn/cuda was disabled by a runtime failure";
      if (cuda_msda_selected()) {
        // 2 decoder layers: one call each.
        EXPECT_GE(calls_after, calls_before + 2) << "the model did not call ms_deform_attn/cuda";
      } else {
        std::cout << "[gpu] NOTE: ms_deform_attn/cuda is not selected on this machine" << std::endl;
      }
      (void)disabled_before;
      ASSERT_TRUE(out.logits.is_cuda());
      EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
      const double dl = (out.logits.cpu() - expected->view("logits")).abs().max().item<double>();
      const double db =
          (out.pred_boxes.cpu() - expected->view("pred_boxes")).abs().max().item<double>();
      bool bijective = false;
      const double dm = matched_max_diff(out.logits, out.pred_boxes, expected->view("logits"),
                                         expected->view("pred_boxes"), bijective);
      std::cout << "[gpu] dfine_tiny " << c10::toString(dtype) << " fused_attention=" << fused
                << ": max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
                << ", query-order-free max diff = " << dm << std::endl;
      if (dtype == at::kFloat) {
        if (dl > 1e-4 || db > 1e-5)
          std::cout << "[gpu] NOTE: rows permuted (adjacent top-k queries swapped)" << std::endl;
        EXPECT_TRUE(bijective);
        EXPECT_LE(dm, 1e-4);
      }
    }
  }
}

TEST(DFineCuda, BatchMatchesSingleImages) {
  // A batch of two (the fixture image and its mirror) gives each image's own result.
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  const std::string dir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/dfine_tiny";
  const auto expected = core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto x = (expected->view("pixel_u8").to(at::kFloat) / 255.0f).cuda();
  const auto batch = at::cat({x, x.flip(-1)}, 0);
  libreyolo::models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = libreyolo::models::load_model(dir, options);
  at::InferenceMode guard;
  const auto both = model->forward(batch);
  const auto first = model->forward(x);
  const auto second = model->forward(x.flip(-1).contiguous());
  bool bij0 = false, bij1 = false;
  const double d0 = matched_max_diff(both.logits.narrow(0, 0, 1), both.pred_boxes.narrow(0, 0, 1),
                                     first.logits, first.pred_boxes, bij0);
  const double d1 = matched_max_diff(both.logits.narrow(0, 1, 1), both.pred_boxes.narrow(0, 1, 1),
                                     second.logits, second.pred_boxes, bij1);
  std::cout << "[gpu] dfine_tiny batch vs single: query-order-free max diff = " << std::max(d0, d1)
            << std::endl;
  EXPECT_TRUE(bij0 && bij1);
  EXPECT_LE(std::max(d0, d1), 1e-4);
}

TEST(DFineCuda, CudaGraphReplayEqualsEager) {
  // No host synchronisation inside forward: the whole D-FINE forward captures and replays.
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  using libreyolo::models::CudaGraphRunner;
  ASSERT_TRUE(CudaGraphRunner::supported());
  libreyolo::test::disable_tf32();
  libreyolo::models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = libreyolo::models::load_model(
      std::string(LIBREYOLO_TEST_FIXTURES) + "/models/dfine_tiny", options);
  const int64_t size = 96;  // 144 + 36 + 9 tokens >= 30 queries
  CudaGraphRunner runner(*model, {1, 2}, size, size, at::kFloat, options.device);
  at::InferenceMode guard;
  const auto pixels = at::rand({2, 3, size, size}, at::TensorOptions().device(options.device));
  const auto eager = model->forward(pixels);
  const auto replay = runner.run(pixels);
  const double dl = (replay.logits - eager.logits).abs().max().item<double>();
  const double db = (replay.pred_boxes - eager.pred_boxes).abs().max().item<double>();
  std::cout << "[gpu] dfine_tiny graph(2) vs eager: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << std::endl;
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
}

}  // namespace
