// CudaGraphRunner (serving.yaml `cuda_graphs`) against eager forward on the RT-DETR fixtures
// (skips without a GPU): replay equals eager, padding to a captured size keeps each row's result,
// mismatched inputs are refused.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <stdexcept>
#include <string>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "models/model.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tests/gpu/model_cuda_test_util.h"

namespace {

using libreyolo::models::CudaGraphRunner;

TEST(CudaGraphRunner, DefaultBatchSizesAreVllmsCaptureSizes) {
  EXPECT_EQ(CudaGraphRunner::default_batch_sizes(8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(CudaGraphRunner::default_batch_sizes(6), (std::vector<int64_t>{1, 2, 4, 6}));
  EXPECT_EQ(CudaGraphRunner::default_batch_sizes(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(CudaGraphRunner::default_batch_sizes(32),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(CudaGraphRunner::default_batch_sizes(20), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
}

TEST(CudaGraphRunner, ReplayEqualsEagerWithPadding) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(CudaGraphRunner::supported());
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const std::string name : {"rtdetr_tiny", "rtdetr_v2_tiny"}) {
    libreyolo::models::LoadOptions options;
    options.device = at::Device("cuda");  // no index: the runner must take the current one
    const auto model = libreyolo::models::load_model(
        std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + name, options);
    const int64_t size = 64;
    CudaGraphRunner runner(*model, {4, 1, 2, 2}, size, size, at::kFloat, options.device);
    EXPECT_EQ(runner.batch_sizes(), (std::vector<int64_t>{1, 2, 4}));
    at::InferenceMode guard;
    const auto pixels = at::rand({3, 3, size, size}, at::TensorOptions().device(options.device));
    const auto eager = model->forward(pixels);
    ASSERT_TRUE(runner.accepts(pixels));
    const auto replay = runner.run(pixels);  // padded to the graph of batch 4
    ASSERT_EQ(replay.logits.sizes(), eager.logits.sizes());
    const double dl = (replay.logits - eager.logits).abs().max().item<double>();
    const double db = (replay.pred_boxes - eager.pred_boxes).abs().max().item<double>();
    std::cout << "[gpu] " << name << " graph(4) on batch 3 vs eager: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << std::endl;
    EXPECT_LE(dl, 1e-4);
    EXPECT_LE(db, 1e-5);
    // A second replay with other pixels must not return the first call's outputs.
    const auto one = pixels.narrow(0, 1, 1).contiguous();
    const auto replay1 = runner.run(one);
    const auto eager1 = model->forward(one);
    EXPECT_LE((replay1.logits - eager1.logits).abs().max().item<double>(), 1e-4);
    EXPECT_LE((replay.logits.narrow(0, 1, 1) - eager1.logits).abs().max().item<double>(), 1e-4);
    // Shapes outside the captured set are refused, never replayed.
    const auto wrong = at::rand({1, 3, size, 2 * size}, at::TensorOptions().device(options.device));
    EXPECT_FALSE(runner.accepts(wrong));
    EXPECT_THROW(runner.run(wrong), std::invalid_argument);
    EXPECT_FALSE(runner.accepts(at::rand({5, 3, size, size}, options.device)));
  }
}

TEST(CudaGraphRunner, UnmaskedLwDetrAndRfDetrEqualTheAllOnesMaskInBfloat16) {
  // LW-DETR / RF-DETR without a pixel_mask skip the masks and keep the unpadded two-stage
  // proposals per geometry (models/lw_detr/two_stage.h), one image's, broadcast over the batch:
  // on CUDA in bfloat16 at batch 2, the same bits as an all-ones mask, eagerly and replayed from
  // a graph captured after the cache was filled by the runner's eager warm-up.
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const std::string name : {"lw_detr_tiny", "rf_detr_tiny"}) {
    SCOPED_TRACE(name);
    libreyolo::models::LoadOptions options;
    options.device = at::Device(at::kCUDA, 0);
    options.dtype = at::kBFloat16;
    const auto model = libreyolo::models::load_model(
        std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + name, options);
    const int64_t h = 192, w = 256;  // multiples of both fixtures' patch * window sides
    CudaGraphRunner runner(*model, {2}, h, w, at::kBFloat16, options.device);
    at::InferenceMode guard;
    const auto cuda = at::TensorOptions().device(options.device);
    const auto pixels = at::randn({2, 3, h, w}, cuda).to(at::kBFloat16);
    const auto unmasked = model->forward(pixels);
    const auto masked = model->forward(pixels, at::ones({2, h, w}, cuda.dtype(at::kLong)));
    EXPECT_TRUE(at::equal(unmasked.logits, masked.logits));
    EXPECT_TRUE(at::equal(unmasked.pred_boxes, masked.pred_boxes));
    const auto replay = runner.run(pixels);
    const double dl = (replay.logits - unmasked.logits).abs().max().item<double>();
    const double db = (replay.pred_boxes - unmasked.pred_boxes).abs().max().item<double>();
    std::cout << "[gpu] " << name << " bf16 graph(2) vs eager, no mask: max|logits diff| = " << dl
              << ", max|pred_boxes diff| = " << db << std::endl;
    // The same kernels on the same inputs; a bfloat16 ulp of slack for any algorithm that a
    // capture may choose differently (cuDNN's benchmark mode).
    EXPECT_LE(dl, 0.05);
    EXPECT_LE(db, 0.01);
  }
}

/// Calls counted so far for the `cuda` ms_deform_attn (the registry's report, what /active shows).
uint64_t cuda_msda_calls() { return libreyolo::test::cuda_msda_state().first; }

TEST(CudaGraphRunner, ReplaysCountTheCapturedKernelCalls) {
  // A replay runs the captured cuda ms_deform_attn launches without calling the slot; the
  // registry's counters must still count them, once per replay.
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  libreyolo::models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = libreyolo::models::load_model(
      std::string(LIBREYOLO_TEST_FIXTURES) + "/models/rtdetr_tiny", options);
  at::InferenceMode guard;
  const auto pixels = at::rand({2, 3, 64, 64}, at::TensorOptions().device(options.device));
  const uint64_t before_eager = cuda_msda_calls();
  model->forward(pixels);
  const uint64_t per_forward = cuda_msda_calls() - before_eager;
  std::cout << "[gpu] rtdetr_tiny: " << per_forward << " cuda ms_deform_attn calls per forward"
            << std::endl;
  ASSERT_GT(per_forward, 0u);  // the decoder layers: the cuda kernel serves this model
  CudaGraphRunner runner(*model, {2}, 64, 64, at::kFloat, options.device);
  const uint64_t before_replays = cuda_msda_calls();
  runner.run(pixels);
  runner.run(pixels.narrow(0, 0, 1).contiguous());
  EXPECT_EQ(cuda_msda_calls() - before_replays, 2 * per_forward);
}

TEST(CudaGraphRunner, CpuModelIsRefusedWithAReason) {
  libreyolo::models::LoadOptions options;
  const auto model = libreyolo::models::load_model(
      std::string(LIBREYOLO_TEST_FIXTURES) + "/models/rtdetr_tiny", options);
  try {
    CudaGraphRunner runner(*model, {1}, 64, 64, at::kFloat, at::kCPU);
    FAIL() << "a CPU model was captured";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), CudaGraphRunner::supported()
                               ? "cuda_graphs: the model is not on a CUDA device"
                               : "cuda_graphs: this build's LibTorch has no CUDA");
  }
}

}  // namespace
