// PP-DocLayoutV3 on CUDA (TF32 off): the fixture's batch (the rendered document page and the
// photograph) equals the transformers CPU fixture on every output (logits, boxes, masks, order
// logits, the reading order), the model's `ms_deform_attn` binding is `cuda` and called once per
// decoder layer, the post-processing on the device equals the fixture's, and a CUDA graph of
// the forward replays what eager computes (order logits included). Skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "models/image/document_layout.h"
#include "models/model.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

using kernels::Registry;

const char* kFixture = "pp_doclayout_v3_tiny";

TEST(PPDocLayoutV3Cuda, OutputsEqualFixtureAndGraphReplayEqualsEager) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  // PPDocLayoutV3ImageProcessor: rescale only (mean 0, std 1).
  const auto pixels = (test::expected_tensor(dir, "pixel_u8").to(at::kFloat) / 255.0f).cuda();
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  options.name = "pp_doclayout_v3_tiny_cuda";
  const auto model = models::load_model(dir, options);
  const auto out = model->forward(pixels);
  for (const auto& b : Registry::process_default().bindings()) {
    if (b.model != options.name || b.slot != kernels::kMsDeformAttn.name) continue;
    EXPECT_EQ(b.selected, "cuda");
    for (const auto& c : b.candidates)
      if (c.name == "cuda") EXPECT_EQ(c.calls, 2u);  // decoder_layers
  }
  test::expect_logits_and_boxes_match(out, test::expected_tensor(dir, "logits"),
                                      test::expected_tensor(dir, "pred_boxes"),
                                      "gpu pp_doclayout_v3");
  const double dm = test::max_abs_diff(out.pred_masks, test::expected_tensor(dir, "out_masks"));
  const double dord =
      test::max_abs_diff(out.order_logits, test::expected_tensor(dir, "order_logits"));
  std::cout << "[gpu] pp_doclayout_v3_tiny: max|masks diff| = " << dm
            << ", max|order_logits diff| = " << dord << "\n";
  EXPECT_LE(dm, 2e-4);
  EXPECT_LE(dord, 1e-4);
  EXPECT_TRUE(at::equal(image::reading_order(out.order_logits).cpu(),
                        test::expected_tensor(dir, "order_seq")));
  const auto pages = image::post_process_document_layout(
      out.logits, out.pred_boxes, out.order_logits, out.pred_masks, {{240, 180}, {400, 600}}, 0.0);
  for (int i = 0; i < 2; ++i) {
    const std::string p = "th0.0_img" + std::to_string(i) + "_";
    EXPECT_TRUE(at::equal(pages[i].order.cpu(), test::expected_tensor(dir, p + "order_seq")));
    EXPECT_TRUE(
        at::equal(pages[i].detections.labels.cpu(), test::expected_tensor(dir, p + "labels")));
    EXPECT_LE(test::max_abs_diff(pages[i].detections.boxes.cpu(),
                                 test::expected_tensor(dir, p + "boxes")),
              1e-2);
  }

  using models::CudaGraphRunner;
  ASSERT_TRUE(CudaGraphRunner::supported());
  CudaGraphRunner runner(*model, {2}, 128, 128, at::kFloat, options.device);
  const auto replay = runner.run(pixels);
  ASSERT_TRUE(replay.order_logits.defined());
  EXPECT_LE(test::max_abs_diff(replay.logits, out.logits), 1e-4);
  EXPECT_LE(test::max_abs_diff(replay.pred_boxes, out.pred_boxes), 1e-5);
  EXPECT_LE(test::max_abs_diff(replay.pred_masks, out.pred_masks), 2e-4);
  EXPECT_LE(test::max_abs_diff(replay.order_logits, out.order_logits), 1e-4);
}

}  // namespace
}  // namespace libreyolo
