// The newer deformable families (LW-DETR, DEIMv2 hybrid, lite and DINOv3) on CUDA: the
// forward equals the transformers CPU fixture (TF32 off), the model's own `ms_deform_attn`
// binding called `cuda` once per decoder layer with no fallback event, and the portable path
// (the same model bound to `reference` only, serving.yaml-style `kernel_slots`) gives the same
// outputs. A kernel wired behind a condition the family never meets never runs, so the calls
// are counted on the model's binding, not the process. Skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

using kernels::Registry;

struct Family {
  const char* fixture;
  int decoder_layers;  ///< config.json decoder_layers: one ms_deform_attn call each
};

/// pixel_values as the fixture's processor makes them: stored (RF-DETR), normalised (LW-DETR) or
/// only rescaled (DEIMv2's RTDetrImageProcessor with do_normalize false; the DINOv3 fixture
/// normalises).
at::Tensor fixture_pixels(const std::string& dir) {
  const auto pre = test::read_json(dir + "/preprocessor_config.json");
  if (models::core::SafetensorsFile::open(dir + "/expected.safetensors")->contains("pixel_values"))
    return test::expected_tensor(dir, "pixel_values");
  if (pre.at("image_processor_type") == "RfDetrImageProcessor") {
    // rf_detr_seg_tiny: its processor on its photographs (bit-exact: rf_detr_parity_test.cpp).
    std::vector<at::Tensor> images;
    const auto meta = test::read_json(dir + "/meta.json");
    for (const auto& name : meta.at("images"))
      images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                                name.get<std::string>()));
    return image::ImageProcessor(
               image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"))
        .preprocess(images)
        .pixel_values;
  }
  if (pre.value("do_normalize", true)) return test::normalized_pixels(dir);
  return test::expected_tensor(dir, "pixel_u8").to(at::kFloat) *
         static_cast<float>(pre.at("rescale_factor").get<double>());
}

/// The named model's binding of `slot` (model = LoadOptions::name).
kernels::BindingReport binding_of(const std::string& model, const std::string& slot) {
  for (auto& b : Registry::process_default().bindings())
    if (b.model == model && b.slot == slot) return b;
  ADD_FAILURE() << "no binding of " << slot << " for model " << model;
  return {};
}

uint64_t calls_of(const kernels::BindingReport& b, const std::string& impl) {
  for (const auto& c : b.candidates)
    if (c.name == impl) return c.calls;
  return 0;
}

class DetrFamilyCuda : public ::testing::TestWithParam<Family> {};

TEST_P(DetrFamilyCuda, CudaKernelIsCalledAndEqualsPortablePathAndFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const Family f = GetParam();
  const auto dir = test::model_fixture(f.fixture);
  const auto pixels = fixture_pixels(dir).cuda();
  const auto logits_ref = test::expected_tensor(dir, "logits");
  const auto boxes_ref = test::expected_tensor(dir, "pred_boxes");

  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  options.name = std::string(f.fixture) + "_cuda";
  const auto model = models::load_model(dir, options);
  const auto events_before = Registry::process_default().events().size();
  const auto out = model->forward(pixels);
  const auto bound = binding_of(options.name, kernels::kMsDeformAttn.name);
  const auto events = Registry::process_default().events();
  for (size_t i = events_before; i < events.size(); ++i)
    EXPECT_NE(events[i].model, options.name) << "fallback event: " << events[i].slot << "/"
                                             << events[i].impl << ": " << events[i].reason;
  std::cout << "[gpu] " << f.fixture << ": ms_deform_attn selected=" << bound.selected
            << " cuda.calls=" << calls_of(bound, "cuda") << "\n";
  EXPECT_EQ(bound.selected, "cuda");
  EXPECT_EQ(calls_of(bound, "cuda"), static_cast<uint64_t>(f.decoder_layers));

  // The portable path: the same checkpoint bound to `reference` only.
  models::LoadOptions portable_options = options;
  portable_options.name = std::string(f.fixture) + "_portable";
  portable_options.kernel_slots = {{kernels::kMsDeformAttn.name, {kernels::kReference}}};
  const auto portable = models::load_model(dir, portable_options);
  const auto ref_out = portable->forward(pixels);
  // Only `reference` allowed: no implementation is bound and the handle runs the portable path.
  const auto portable_bound = binding_of(portable_options.name, kernels::kMsDeformAttn.name);
  EXPECT_EQ(portable_bound.selected, kernels::kUnavailable);
  EXPECT_EQ(calls_of(portable_bound, "cuda"), 0u);

  const double dl = test::max_abs_diff(out.logits, logits_ref);
  const double db = test::max_abs_diff(out.pred_boxes, boxes_ref);
  const double pl = test::max_abs_diff(out.logits, ref_out.logits);
  const double pb = test::max_abs_diff(out.pred_boxes, ref_out.pred_boxes);
  std::cout << "[gpu] " << f.fixture << " cuda vs transformers CPU: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "; cuda vs portable: " << pl << ", " << pb
            << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
  EXPECT_LE(pl, 1e-4);
  EXPECT_LE(pb, 1e-5);
}

TEST(DeformableDetrCuda, CudaGraphReplayEqualsEager) {
  // Deformable DETR's 2-coordinate reference points divide the offsets by each level's (W, H);
  // that normaliser was copied from the host, which the capture refused at 800x1333 on the H200
  // (docs/BENCHMARKS.md, "Against torch.compile", its second run). Now filled on the device: the
  // forward captures.
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  using models::CudaGraphRunner;
  ASSERT_TRUE(CudaGraphRunner::supported());
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(test::model_fixture("deformable_detr_tiny"), options);
  const int64_t height = 64, width = 96;
  CudaGraphRunner runner(*model, {1, 2}, height, width, at::kFloat, options.device);
  c10::InferenceMode guard;
  const auto pixels = at::rand({2, 3, height, width}, at::TensorOptions().device(options.device));
  const auto eager = model->forward(pixels);
  const auto replay = runner.run(pixels);
  const double dl = test::max_abs_diff(replay.logits, eager.logits);
  const double db = test::max_abs_diff(replay.pred_boxes, eager.pred_boxes);
  std::cout << "[gpu] deformable_detr_tiny graph(2) vs eager: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
}

// DETR (DetrForObjectDetection: dense attention only, no ms_deform_attn) and the families that
// share its stem and encoder (ConditionalDetrForObjectDetection, DabDetrForObjectDetection) on
// CUDA: the fixture's padded batch with its pixel_mask equals the transformers CPU fixture (TF32
// off), and a CUDA graph of the forward replays what eager computes.
class DetrCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(DetrCuda, PaddedBatchEqualsFixtureAndGraphReplayEqualsEager) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  using models::CudaGraphRunner;
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(GetParam());
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  const auto pixels = test::normalized_pixels(dir).cuda();
  const auto mask = test::expected_mask(dir).cuda();
  const auto out = model->forward(pixels, mask);
  const double dl = test::max_abs_diff(out.logits, test::expected_tensor(dir, "logits"));
  const double db = test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "pred_boxes"));
  std::cout << "[gpu] " << GetParam() << " cuda vs transformers CPU: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);

  ASSERT_TRUE(CudaGraphRunner::supported());
  const int64_t height = 64, width = 96;
  CudaGraphRunner runner(*model, {1, 2}, height, width, at::kFloat, options.device);
  const auto x = at::rand({2, 3, height, width}, at::TensorOptions().device(options.device));
  const auto eager = model->forward(x);
  const auto replay = runner.run(x);
  const double gl = test::max_abs_diff(replay.logits, eager.logits);
  const double gb = test::max_abs_diff(replay.pred_boxes, eager.pred_boxes);
  std::cout << "[gpu] " << GetParam() << " graph(2) vs eager: max|logits diff| = " << gl
            << ", max|pred_boxes diff| = " << gb << "\n";
  EXPECT_LE(gl, 1e-4);
  EXPECT_LE(gb, 1e-5);
}

// DetrForSegmentation on CUDA: the padded batch's logits, boxes and pred_masks (the bbox
// attention and the FPN mask head) equal the transformers CPU fixture (TF32 off).
TEST(DetrPanopticCuda, PaddedBatchEqualsFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture("detr_panoptic_tiny");
  models::LoadOptions options;
  options.device = at::Device(at::kCUDA, 0);
  const auto model = models::load_model(dir, options);
  ASSERT_EQ(model->task(), models::Task::panoptic_segmentation);
  const auto out =
      model->forward(test::normalized_pixels(dir).cuda(), test::expected_mask(dir).cuda());
  const double dl = test::max_abs_diff(out.logits, test::expected_tensor(dir, "logits"));
  const double db = test::max_abs_diff(out.pred_boxes, test::expected_tensor(dir, "pred_boxes"));
  const double dm = test::max_abs_diff(out.pred_masks, test::expected_tensor(dir, "pred_masks"));
  std::cout << "[gpu] detr_panoptic_tiny cuda vs transformers CPU: max|logits diff| = " << dl
            << ", max|pred_boxes diff| = " << db << ", max|pred_masks diff| = " << dm << "\n";
  EXPECT_LE(dl, 1e-4);
  EXPECT_LE(db, 1e-5);
  EXPECT_LE(dm, 2e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DetrCuda,
                         ::testing::Values("detr_tiny", "detr_tiny_timm", "detr_tiny_timm_basic",
                                           "conditional_detr_tiny", "dab_detr_tiny",
                                           "table_transformer_tiny"),
                         [](const auto& info) { return std::string(info.param); });

INSTANTIATE_TEST_SUITE_P(Fixtures, DetrFamilyCuda,
                         ::testing::Values(Family{"lw_detr_tiny", 2}, Family{"deimv2_tiny", 2},
                                           Family{"deimv2_tiny_lite", 3},
                                           Family{"deimv2_tiny_dinov3", 2},
                                           Family{"rf_detr_tiny", 2},
                                           Family{"rf_detr_seg_tiny", 2}),
                         [](const auto& info) { return std::string(info.param.fixture); });

}  // namespace
}  // namespace libreyolo
