// The sampling_locations slot's entry point and portable path: the CPU loop gives exactly the
// values of upstream's ATen expression (the RT-DETR v1 and D-FINE forms, float32 / bfloat16 /
// float16), so does the ATen path (float64 here, CUDA in use), bad shapes are refused before any
// implementation runs, and a bound implementation is called (the modules hold the handle).
#include "kernels/attention/sampling_locations.h"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/registry.h"
#include "models/deformable_detr/ms_deform_attention.h"
#include "models/layers/bound_kernels.h"
#include "tests/unit/error_message.h"

namespace {

using libreyolo::kernels::PointScale;
using libreyolo::kernels::sampling_locations_fused;

// The entry point with no implementation bound: the portable path.
at::Tensor sampling_locations(const at::Tensor& offsets, const at::Tensor& ref,
                              const PointScale& scale, double factor) {
  return libreyolo::kernels::sampling_locations({}, offsets, ref, scale, factor);
}

// Upstream's own code, written out: modeling_rt_detr.py (v1) and modeling_d_fine.py, on
// reference boxes (B, Q, 1, 4) as their decoders hand them over.
at::Tensor rtdetr_v1(const at::Tensor& offsets6, const at::Tensor& ref, int64_t points) {
  const auto r = ref.unsqueeze(2).unsqueeze(4);  // (B, Q, 1, 1, 1, 4)
  return r.slice(-1, 0, 2) + offsets6 / static_cast<double>(points) * r.slice(-1, 2, 4) * 0.5;
}
at::Tensor dfine(const at::Tensor& offsets, const at::Tensor& ref, const at::Tensor& nps,
                 double offset_scale) {
  const auto r = ref.unsqueeze(2);  // (B, Q, 1, 1, 4)
  return r.slice(-1, 0, 2) + offsets * nps.unsqueeze(-1) * r.slice(-1, 2, 4) * offset_scale;
}

class SamplingLocations : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(SamplingLocations, RtDetrV1FormEqualsUpstreamExpression) {
  const auto dtype = GetParam();
  at::manual_seed(3);
  // P = 3: a division by 3 and a multiplication by its reciprocal round differently.
  const int64_t B = 2, Q = 300, H = 8, L = 3, P = 3;
  // Offsets of the size a trained head gives (a few pixels' worth), boxes in (0, 1).
  const auto offsets6 = (at::randn({B, Q, H, L, P, 2}) * 3).to(dtype);
  const auto ref = at::rand({B, Q, 1, 4}).to(dtype);
  const auto expected = rtdetr_v1(offsets6, ref, P);
  const auto scale = PointScale::divide_by(static_cast<double>(P));
  EXPECT_EQ(sampling_locations_fused(offsets6.view({B, Q, H, L * P, 2}), ref, scale),
            dtype != at::kDouble);
  const auto got = sampling_locations(offsets6.view({B, Q, H, L * P, 2}), ref, scale, 0.5);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{B, Q, H, L * P, 2}));
  EXPECT_EQ(got.scalar_type(), dtype);
  EXPECT_TRUE(at::equal(got, expected.view({B, Q, H, L * P, 2})))
      << "max |diff| "
      << (got.to(at::kDouble) - expected.view_as(got).to(at::kDouble)).abs().max().item<double>();
}

TEST_P(SamplingLocations, DFineFormEqualsUpstreamExpression) {
  const auto dtype = GetParam();
  at::manual_seed(4);
  const int64_t B = 1, Q = 300, H = 8;
  // D-FINE L's points per level {3, 6, 3}: num_points_scale 1/3 x3, 1/6 x6, 1/3 x3.
  std::vector<float> scale;
  for (int64_t p : {3, 6, 3})
    for (int64_t i = 0; i < p; ++i) scale.push_back(1.0f / static_cast<float>(p));
  const auto nps = at::tensor(scale).to(dtype);
  const int64_t N = nps.size(0);
  const auto offsets = (at::randn({B, Q, H, N, 2}) * 3).to(dtype);
  // Non-contiguous reference boxes, as a slice of a wider tensor hands them over.
  const auto ref = at::rand({B, Q, 1, 6}).to(dtype).slice(-1, 1, 5);
  // offset_scale 0.3 (D-FINE's is 0.5): a factor that is no power of two tests its rounding.
  const auto expected = dfine(offsets, ref, nps, 0.3);
  EXPECT_EQ(sampling_locations_fused(offsets, ref, PointScale::multiply_by(nps)),
            dtype != at::kDouble);
  const auto got = sampling_locations(offsets, ref, PointScale::multiply_by(nps), 0.3);
  // The (B, Q, 4) form of the same boxes gives the same values.
  EXPECT_TRUE(at::equal(
      sampling_locations(offsets, ref.squeeze(2), PointScale::multiply_by(nps), 0.3), got));
  EXPECT_TRUE(at::equal(got, expected))
      << "max |diff| "
      << (got.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SamplingLocations,
                         // float64 takes the ATen path, the one CUDA tensors take.
                         ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf, at::kDouble),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(SamplingLocationsShapes, MismatchesNameTheArgument) {
  const auto offsets = at::zeros({1, 5, 2, 3, 2});
  EXPECT_EQ(libreyolo::test::message_of([&] {
              sampling_locations(offsets, at::zeros({1, 4, 4}), PointScale::divide_by(3), 0.5);
            }),
            "sampling_locations: reference_boxes must be (B, Q, 4) or (B, Q, 1, 4) with offsets' "
            "B and Q, got [1, 4, 4] for offsets [1, 5, 2, 3, 2]");
  EXPECT_EQ(libreyolo::test::message_of([&] {
              sampling_locations(offsets, at::zeros({1, 5, 4}),
                                 PointScale::multiply_by(at::ones({4})), 0.5);
            }),
            "sampling_locations: per_point must be (N) = (3), got [4]");
  EXPECT_EQ(libreyolo::test::message_of([&] {
              sampling_locations(at::zeros({1, 5, 2, 3}), at::zeros({1, 5, 4}),
                                 PointScale::divide_by(3), 0.5);
            }),
            "sampling_locations: offsets must be (B, Q, H, N, 2), got [1, 5, 2, 3]");
  EXPECT_EQ(libreyolo::test::message_of([&] {
              sampling_locations(offsets, at::zeros({1, 5, 4}), PointScale{}, 0.5);
            }),
            "sampling_locations: give either a divisor or per-point scales");
}

TEST(SamplingLocationsShapes, TensorsThatRequireGradTakeTheAtenPath) {
  const auto offsets = at::zeros({1, 5, 2, 3, 2}).requires_grad_();
  EXPECT_FALSE(sampling_locations_fused(offsets, at::zeros({1, 5, 4}), PointScale::divide_by(3)));
  c10::AutoGradMode no_grad(false);
  EXPECT_TRUE(sampling_locations_fused(offsets, at::zeros({1, 5, 4}), PointScale::divide_by(3)));
}

TEST(SamplingLocationsShapes, ReferenceBoxesOfAnotherDtypeAreRefused) {
  EXPECT_EQ(libreyolo::test::message_of([&] {
              sampling_locations(at::zeros({1, 5, 2, 3, 2}), at::zeros({1, 5, 4}, at::kDouble),
                                 PointScale::divide_by(3), 0.5);
            }),
            "sampling_locations: reference_boxes must have the offsets' dtype Float, got Double");
}

// Deformable DETR's module (LW-DETR's and RF-DETR's decoder layers) calls the handle it was bound
// to when every level has the same box, and keeps upstream's expression for per-level boxes (the
// valid ratios of a padded batch).
TEST(SamplingLocationsSlot, DeformableAttentionModuleCallsItsBoundHandleForOneBoxPerQuery) {
  using namespace libreyolo;
  // Every slot bind_kernels binds, with no implementation but the counting one (the built-in
  // `cpu` ms_deform_attn would round otherwise than the unbound module's portable path).
  kernels::Registry r;
  r.declare(kernels::kMsDeformAttn);
  r.declare(kernels::kSamplingLocations);
  r.declare(kernels::kRefineBoxes);
  r.declare(kernels::kRotaryEmbedding);
  r.declare(kernels::kAttention);
  r.declare(kernels::kConv2dBiasAct);
  r.declare(kernels::kMaxPool2d);
  r.declare(kernels::kAddLayerNorm);
  r.declare(kernels::kLinearAct);
  r.declare(kernels::kLinear);
  int calls = 0;
  bool centre = false;  // answer every location with the map's centre: a marker in the output
  r.register_impl(kernels::kSamplingLocations, "counting",
                  [&calls, &centre](const at::Tensor& offsets, const at::Tensor& boxes,
                                    const at::Tensor& per_point, double divisor,
                                    double factor) -> kernels::Outcome<at::Tensor> {
                    ++calls;
                    if (centre) return at::full_like(offsets, 0.5);
                    EXPECT_EQ(boxes.dim(), 3);
                    EXPECT_FALSE(per_point.defined());
                    EXPECT_EQ(divisor, 4.0);
                    EXPECT_EQ(factor, 0.5);
                    return kernels::sampling_locations_portable(
                        offsets, boxes, PointScale::divide_by(divisor), factor);
                  });
  at::manual_seed(5);
  auto attn = std::make_shared<models::deformable_detr::MultiscaleDeformableAttentionImpl>(
      /*d_model=*/32, /*num_heads=*/4, /*num_levels=*/2, /*num_points=*/4);
  at::NoGradGuard no_grad;
  for (auto& p : attn->parameters()) p.uniform_(-0.2, 0.2);
  const kernels::SpatialShapes shapes{{4, 4}, {2, 2}};
  const auto hidden = at::randn({2, 5, 32}), memory = at::randn({2, 20, 32});
  const auto boxes = at::rand({2, 5, 4}) * 0.5 + 0.25;
  const auto expanded = boxes.unsqueeze(2).expand({-1, -1, 2, -1});
  const auto unbound = attn->forward(hidden, {}, memory, {}, expanded, shapes);
  EXPECT_EQ(calls, 0);
  models::layers::bind_kernels(*attn, r, kernels::BindContext{}, kernels::Filter{});
  const auto bound = attn->forward(hidden, {}, memory, {}, expanded, shapes);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::equal(bound, unbound));
  // (B, Q, 1, 4): one box for every level too, the slot again.
  EXPECT_TRUE(
      at::equal(attn->forward(hidden, {}, memory, {}, boxes.unsqueeze(2), shapes), unbound));
  EXPECT_EQ(calls, 2);
  // The module samples where the slot says: the marker changes the output.
  centre = true;
  const auto marked = attn->forward(hidden, {}, memory, {}, expanded, shapes);
  EXPECT_EQ(calls, 3);
  EXPECT_GT((marked - unbound).abs().max().item<double>(), 1e-3);
  // Per-level boxes: upstream's expression, not the slot; the same values where they coincide.
  const auto per_level = attn->forward(hidden, {}, memory, {}, expanded.contiguous(), shapes);
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(at::equal(per_level, unbound));
}

}  // namespace
