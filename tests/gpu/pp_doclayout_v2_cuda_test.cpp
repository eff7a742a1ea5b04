// PP-DocLayoutV2 on CUDA (TF32 off), against the transformers CPU fixture (the rendered document
// page and the photograph). The model sorts its queries kept-first with ATen's unstable sort,
// whose order among equal keys is the device's (CPU introsort vs CUDA's sort): the outputs are
// compared row for row through the query permutation (each row matched to the fixture row of
// the same box), the reading-order transformer on the fixture's captured inputs, and, when
// CUDA's permutation is the CPU's, the order logits and the reading order as upstream's. A CUDA
// graph of the forward replays what eager computes. Skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>

#include "models/image/document_layout.h"
#include "models/model.h"
#include "models/pp_doclayout_v2/modules.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

const char* kFixture = "pp_doclayout_v2_tiny";

TEST(PPDocLayoutV2Cuda, OutputsMatchFixtureAndGraphReplayEqualsEager) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  const auto pixels = (test::expected_tensor(dir, "pixel_u8").to(at::kFloat) / 255.0f).cuda();
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  options.name = "pp_doclayout_v2_tiny_cuda";
  const auto model = models::load_model(dir, options);
  const auto out = model->forward(pixels);

  // Each row is the fixture row with the same box (the boxes are distinct), same logits.
  const auto boxes = out.pred_boxes.cpu(), logits = out.logits.cpu();
  const auto want_boxes = test::expected_tensor(dir, "pred_boxes");
  const auto want_logits = test::expected_tensor(dir, "logits");
  const at::Tensor match = at::cdist(boxes, want_boxes).argmin(-1);  // (B, Q)
  const auto rows = match.unsqueeze(-1);
  EXPECT_TRUE(at::equal(std::get<0>(match.sort(-1)), at::arange(24).expand({2, 24})));
  const double db = test::max_abs_diff(boxes, want_boxes.gather(1, rows.expand({-1, -1, 4})));
  const double dl = test::max_abs_diff(logits, want_logits.gather(1, rows.expand({-1, -1, 5})));
  const bool same_order = at::equal(match, at::arange(24).expand({2, 24}));
  std::cout << "[gpu] pp_doclayout_v2_tiny: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << ", CUDA's sort order "
            << (same_order ? "equals" : "differs from") << " the CPU's\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);

  // The reading order alone on upstream's inputs.
  std::shared_ptr<models::pp_doclayout_v2::ReadingOrderImpl> reading_order;
  for (const auto& child : model->root().named_children())
    if (child.key() == "reading_order")
      reading_order =
          std::dynamic_pointer_cast<models::pp_doclayout_v2::ReadingOrderImpl>(child.value());
  ASSERT_NE(reading_order, nullptr);
  const auto ro = reading_order->forward(test::expected_tensor(dir, "ro_boxes").cuda(),
                                         test::expected_tensor(dir, "ro_labels").cuda(),
                                         test::expected_tensor(dir, "ro_mask").cuda());
  const double dro = test::max_abs_diff(ro.cpu(), test::expected_tensor(dir, "ro_logits"));
  std::cout << "[gpu] pp_doclayout_v2_tiny reading order alone: max|diff| = " << dro << "\n";
  EXPECT_LE(dro, 1e-4);
  if (same_order) {
    EXPECT_LE(
        test::max_abs_diff(out.order_logits.cpu(), test::expected_tensor(dir, "order_logits")),
        1e-4);
    EXPECT_TRUE(at::equal(image::reading_order(out.order_logits).cpu(),
                          test::expected_tensor(dir, "order_seq")));
  }

  using models::CudaGraphRunner;
  ASSERT_TRUE(CudaGraphRunner::supported());
  CudaGraphRunner runner(*model, {2}, 128, 128, at::kFloat, options.device);
  const auto replay = runner.run(pixels);
  ASSERT_TRUE(replay.order_logits.defined());
  EXPECT_LE(test::max_abs_diff(replay.logits, out.logits), 1e-4);
  EXPECT_LE(test::max_abs_diff(replay.pred_boxes, out.pred_boxes), 1e-5);
  EXPECT_LE(test::max_abs_diff(replay.order_logits, out.order_logits), 1e-4);
}

}  // namespace
}  // namespace libreyolo
