// The refine_boxes slot (kernels/box/refine_boxes.h): the portable path is upstream's expression
// (models/layers inverse_sigmoid, then add and sigmoid) bit for bit in every CPU dtype, on boxes
// inside, at and beyond [0, 1] and NaN; the entry point calls the handle's implementation and
// falls back when it declines; bad arguments get exact messages.
#include "kernels/box/refine_boxes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/registry.h"
#include "models/layers/layers.h"
#include "tests/unit/error_message.h"

namespace libreyolo {
namespace {

/// Boxes over every branch of inverse_sigmoid: inside (0, 1), 0 and 1 exactly, below eps, within
/// eps of 1, outside [0, 1], and a NaN; deltas of a few units.
std::pair<at::Tensor, at::Tensor> operands(at::ScalarType dtype) {
  at::manual_seed(3);
  auto ref = at::rand({2, 7, 4}) * 1.4 - 0.2;
  auto flat = ref.view(-1);
  const float specials[] = {0.0f, 1.0f, 1e-7f, 1.0f - 1e-7f, 2e-5f, -3.0f, 4.0f, NAN};
  for (int i = 0; i < 8; ++i) flat[i] = specials[i];
  return {(at::randn({2, 7, 4}) * 3).to(dtype), ref.to(dtype)};
}

TEST(RefineBoxes, PortableIsUpstreamsExpressionBitForBit) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const auto [delta, ref] = operands(dtype);
    const auto expected = at::sigmoid(delta + models::layers::inverse_sigmoid(ref));
    const auto got = kernels::refine_boxes(kernels::RefineBoxesHandle(), delta, ref);
    EXPECT_EQ(got.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(at::nan_to_num(got, 7.0), at::nan_to_num(expected, 7.0)))
        << c10::toString(dtype);
    // Only the NaN reference gives a NaN (clamp keeps it; nothing else can).
    EXPECT_EQ(at::isnan(got).sum().item<int64_t>(), 1) << c10::toString(dtype);
    EXPECT_TRUE(std::isnan(got.view(-1)[7].item<double>())) << c10::toString(dtype);
  }
}

TEST(RefineBoxes, EntryPointCallsTheBoundImplementationAndFallsBackOnDecline) {
  kernels::Registry r;
  r.declare(kernels::kRefineBoxes);
  int calls = 0;
  bool decline = false;
  r.register_impl(
      kernels::kRefineBoxes, "marker",
      [&](const at::Tensor& delta, const at::Tensor&, double eps) -> kernels::Outcome<at::Tensor> {
        ++calls;
        EXPECT_EQ(eps, 1e-5);
        if (decline) return kernels::Decline{"marker: declines"};
        return at::full_like(delta, 0.25);
      });
  const auto handle = r.bind(kernels::kRefineBoxes, kernels::BindContext{});
  const auto [delta, ref] = operands(at::kFloat);
  EXPECT_TRUE(at::equal(kernels::refine_boxes(handle, delta, ref), at::full_like(delta, 0.25)));
  decline = true;
  EXPECT_TRUE(at::equal(at::nan_to_num(kernels::refine_boxes(handle, delta, ref), 7.0),
                        at::nan_to_num(kernels::refine_boxes_portable(delta, ref), 7.0)));
  EXPECT_EQ(calls, 2);
}

TEST(RefineBoxes, BadArgumentsNameTheProblem) {
  const kernels::RefineBoxesHandle none;
  const auto a = at::zeros({2, 3, 4}), b = at::zeros({2, 3, 2});
  EXPECT_EQ(test::message_of([&] { kernels::refine_boxes(none, a, b); }),
            "refine_boxes: delta [2, 3, 4] and reference [2, 3, 2] must have one shape");
  EXPECT_EQ(test::message_of([&] { kernels::refine_boxes(none, a, a.to(at::kHalf)); }),
            "refine_boxes: delta (Float) and reference (Half) must share one floating dtype");
  EXPECT_EQ(
      test::message_of([&] { kernels::refine_boxes(none, a.to(at::kLong), a.to(at::kLong)); }),
      "refine_boxes: delta (Long) and reference (Long) must share one floating dtype");
  EXPECT_EQ(test::message_of([&] { kernels::refine_boxes(none, at::Tensor(), a); }),
            "refine_boxes: delta and reference must be defined");
}

}  // namespace
}  // namespace libreyolo
