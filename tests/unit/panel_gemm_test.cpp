// kernels/cpu/panel_gemm.h: the packed panels' layout, and gemm_panels against a float64 product
// over row, column and depth counts off its 6 x 16 block (skipped on CPUs it does not run on).
#include "kernels/cpu/panel_gemm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace libreyolo::kernels {
namespace {

TEST(PanelGemm, PacksSixteenColumnPanelsPaddedWithZeros) {
  // B (2 x 20), b[k][n] = 100 k + n: two panels, the second with 4 real columns.
  std::vector<float> b(2 * 20);
  for (int k = 0; k < 2; ++k)
    for (int n = 0; n < 20; ++n) b[k * 20 + n] = static_cast<float>(100 * k + n);
  ASSERT_EQ(panel_size(2, 20), 64);
  std::vector<float> packed(64, -1.0f);
  pack_panels(b.data(), 20, 2, 20, packed.data());
  EXPECT_EQ(packed[0], 0.0f);     // panel 0, k 0, column 0
  EXPECT_EQ(packed[15], 15.0f);   // panel 0, k 0, column 15
  EXPECT_EQ(packed[16], 100.0f);  // panel 0, k 1, column 0
  EXPECT_EQ(packed[32], 16.0f);   // panel 1, k 0, column 16
  EXPECT_EQ(packed[35], 19.0f);   // panel 1, k 0, column 19
  EXPECT_EQ(packed[36], 0.0f);    // panel 1, k 0, past column 19: zero
  EXPECT_EQ(packed[48], 116.0f);  // panel 1, k 1, column 16
  EXPECT_EQ(packed[63], 0.0f);
}

TEST(PanelGemm, MatchesAFloat64ProductAtEveryTail) {
  if (!panel_gemm_available()) GTEST_SKIP() << "no AVX2 + FMA, or AVX-512F (MKL's sgemm runs)";
  at::manual_seed(7);
  struct Shape {
    int64_t m, k, n;
  };
  // Every row block (1 to 6 rows) and last-panel widths from 1 to 16, both halves of the mask.
  for (const Shape s :
       {Shape{1, 1, 1}, Shape{6, 48, 16}, Shape{7, 33, 17}, Shape{101, 128, 128}, Shape{5, 9, 8},
        Shape{13, 64, 40}, Shape{12, 3, 31}, Shape{2, 5, 25}, Shape{3, 17, 9}, Shape{4, 20, 24}}) {
    SCOPED_TRACE(testing::Message() << s.m << " x " << s.k << " x " << s.n);
    // A with a row stride past K, C with one past N: both must be honoured.
    const auto a = at::randn({s.m, s.k + 3}).narrow(1, 0, s.k);
    const auto b = at::randn({s.k, s.n});
    std::vector<float> packed(static_cast<size_t>(panel_size(s.k, s.n)));
    pack_panels(b.data_ptr<float>(), s.n, s.k, s.n, packed.data());
    auto c = at::full({s.m, s.n + 5}, 7.0f);
    gemm_panels(a.data_ptr<float>(), s.k + 3, s.m, s.k, packed.data(), s.n, c.data_ptr<float>(),
                s.n + 5);
    const auto want = at::mm(a.to(at::kDouble), b.to(at::kDouble));
    const auto got = c.narrow(1, 0, s.n).to(at::kDouble);
    // One FMA chain of K terms: within K ulps of the sum of |a||b| terms.
    const auto bound = at::mm(a.abs().to(at::kDouble), b.abs().to(at::kDouble)) *
                       (static_cast<double>(s.k) * 1.2e-7);
    EXPECT_TRUE(((got - want).abs() <= bound).all().item<bool>());
    // The columns past N are left as they were.
    EXPECT_TRUE((c.narrow(1, s.n, 5) == 7.0f).all().item<bool>());
  }
}

}  // namespace
}  // namespace libreyolo::kernels
