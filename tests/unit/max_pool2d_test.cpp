// The max_pool2d slot: the output-size formula against at::max_pool2d's own shapes, inputs
// validated before any implementation (exact messages), a declining implementation falls back
// to the portable path, layers::MaxPool2d receives its handle from bind_kernels, and the `cpu`
// implementation (kernels/pool/cpu/max_pool2d_cpu.cpp) equals at::max_pool2d bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/pool/max_pool2d_problem.h"
#include "kernels/registry.h"
#include "models/layers/bound_kernels.h"
#include "models/layers/max_pool.h"
#include "tests/unit/error_message.h"

namespace libreyolo::kernels {
namespace {

using test::message_of;

TEST(MaxPool2d, OutputSizeIsAtensForEveryGeometry) {
  int checked = 0;
  for (int64_t in = 1; in <= 12; ++in)
    for (int64_t k = 1; k <= 4; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t d = 1; d <= 2; ++d)
          for (int64_t p = 0; p <= k / 2; ++p)
            for (bool ceil : {false, true}) {
              const int64_t ours = max_pool2d_output_size(in, k, p, s, d, ceil);
              at::Tensor y;
              try {
                y = at::max_pool2d(at::zeros({1, 1, in, 1}), {k, 1}, {s, 1}, {p, 0}, {d, 1}, ceil);
              } catch (const c10::Error&) {  // "Output size is too small": ours refuses too
                EXPECT_LE(ours, 0) << in << " " << k << " " << p << " " << s << " " << d;
                continue;
              }
              EXPECT_EQ(ours, y.size(2)) << "in " << in << " k " << k << " p " << p << " s " << s
                                         << " d " << d << " ceil " << ceil;
              ++checked;
            }
  EXPECT_GT(checked, 1000);
  // The backbones' two poolings: the ResNet stem and HGNetV2's padded stem.
  EXPECT_EQ(max_pool2d_output_size(320, 3, 1, 2, 1, false), 160);
  EXPECT_EQ(max_pool2d_output_size(321, 2, 0, 1, 1, true), 320);
}

TEST(MaxPool2d, InputsAreCheckedBeforeAnyImplementation) {
  Registry r;
  r.declare(kMaxPool2d);
  int calls = 0;
  r.register_impl(kMaxPool2d, "counting",
                  [&calls](const at::Tensor&, const PoolGeometry&) -> Outcome<at::Tensor> {
                    ++calls;
                    return Decline{"never"};
                  });
  const auto h = r.bind(kMaxPool2d, BindContext{});
  PoolGeometry g;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  const auto x = at::randn({2, 3, 9, 8});
  EXPECT_EQ(message_of([&] { max_pool2d(h, x[0], g); }),
            "max_pool2d: input must be (B, C, H, W), got [3, 9, 8]");
  EXPECT_EQ(message_of([&] {
              max_pool2d(h, at::randn({2, 3, 0, 8}), g);
            }),
            "max_pool2d: input must have non-zero C, H and W, got [2, 3, 0, 8]");
  EXPECT_EQ(max_pool2d(h, at::randn({0, 3, 9, 8}), g).sizes(),  // an empty batch is allowed
            (std::vector<int64_t>{0, 3, 5, 4}));
  PoolGeometry wide = g;
  wide.pad_w = 2;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, wide); }),
            "max_pool2d: padding must be >= 0 and at most half the kernel size");
  PoolGeometry zero = g;
  zero.stride_h = 0;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, zero); }),
            "max_pool2d: kernel, stride and dilation must be >= 1");
  PoolGeometry big = g;
  big.kernel_h = 13;
  big.pad_h = 1;
  EXPECT_EQ(message_of([&] { max_pool2d(h, x, big); }),
            "max_pool2d: the input [2, 3, 9, 8] is smaller than one pooling window");
  EXPECT_EQ(calls, 1);  // the empty batch above
  // A declining implementation is called and counted, then at::max_pool2d answers.
  const auto out = max_pool2d(h, x, g);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(at::equal(out, at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1})));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 5, 4}));
  EXPECT_EQ(r.bindings().at(0).candidates.at(0).declined.at("never"), 2u);
}

TEST(MaxPool2d, TheLayerCallsTheHandleBindKernelsGaveIt) {
  Registry r;
  register_builtin_slots(r);
  int calls = 0;
  r.register_impl(kMaxPool2d, "counting",
                  [&calls](const at::Tensor& x, const PoolGeometry& g) -> Outcome<at::Tensor> {
                    ++calls;
                    return max_pool2d_portable(x, g) + 1;  // recognisable
                  });
  torch::nn::Module root;
  auto pool = root.register_module("pool", std::make_shared<models::layers::MaxPool2dImpl>(
                                               models::layers::square_pool(2, 1, 0, true)));
  const auto x = at::randn({1, 4, 5, 5});
  const auto ref = at::max_pool2d(x, {2, 2}, {1, 1}, {0, 0}, {1, 1}, true);
  EXPECT_TRUE(at::equal(pool->forward(x), ref));  // unbound: the portable path
  EXPECT_EQ(calls, 0);
  models::layers::bind_kernels(root, r, BindContext{}, Filter{});
  EXPECT_TRUE(at::equal(pool->forward(x), ref + 1));
  EXPECT_EQ(calls, 1);
}

/// The candidate `name`'s report of slot max_pool2d in `r`.
CandidateReport pool_candidate(Registry& r, const std::string& name) {
  for (const auto& slot : r.report())
    if (slot.slot == kMaxPool2d.name)
      for (const auto& c : slot.candidates)
        if (c.name == name) return c;
  ADD_FAILURE() << "no candidate " << name;
  return {};
}

/// a == b element for element, NaN where the other has NaN.
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  const auto na = at::isnan(a), nb = at::isnan(b);
  return a.sizes() == b.sizes() && at::equal(na, nb) &&
         at::equal(at::where(na, at::zeros_like(a), a), at::where(nb, at::zeros_like(b), b));
}

/// Every geometry the backbones use (HGNetV2's 2x2 stride-1 ceil_mode stem, the ResNet 3x3
/// stride-2 stem) and odd ones (dilation, asymmetric kernels and strides, ceil_mode windows
/// hanging off the edge), on channels_last maps of float32, bfloat16 and float16 with NaNs and an
/// all-negative corner (implicit padding is -inf, not 0): the `cpu` implementation serves every
/// call and its output equals at::max_pool2d's, values, NaNs and channels_last layout.
TEST(MaxPool2dCpu, EqualsAtenBitForBit) {
  Registry r;
  register_builtin_slots(r);
  const auto h = r.bind(kMaxPool2d, BindContext{});
  ASSERT_EQ(r.bindings().at(0).selected, "cpu");
  struct Case {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    bool ceil;
  };
  const std::vector<Case> cases = {
      {2, 2, 1, 1, 0, 0, 1, 1, true},   // HGNetV2 stem (on the zero-padded map)
      {3, 3, 2, 2, 1, 1, 1, 1, false},  // ResNet stem
      {3, 3, 2, 2, 1, 1, 2, 2, false}, {3, 2, 2, 1, 1, 0, 1, 1, true},
      {3, 3, 3, 3, 1, 1, 1, 1, true},  {1, 1, 2, 2, 0, 0, 1, 1, false},
      {5, 5, 1, 1, 2, 2, 1, 1, false},
  };
  at::manual_seed(7);
  int calls = 0;
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const int64_t c : {3, 32, 67})
      for (const auto& k : cases) {
        auto x = at::randn({2, c, 13, 11}).to(dtype);
        x.index_put_(
            {0, at::indexing::Slice(), at::indexing::Slice(0, 3), at::indexing::Slice(0, 3)},
            -5.0 - at::rand({c, 3, 3}).to(dtype));
        x.index_put_({1, 1, 4, 5}, std::numeric_limits<float>::quiet_NaN());
        x = x.contiguous(at::MemoryFormat::ChannelsLast);
        PoolGeometry g{k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.ceil};
        const auto out = max_pool2d(h, x, g);
        ++calls;
        const auto ref =
            at::max_pool2d(x, {k.kh, k.kw}, {k.sh, k.sw}, {k.ph, k.pw}, {k.dh, k.dw}, k.ceil);
        EXPECT_TRUE(same_values(out, ref))
            << dtype << " C " << c << " kernel " << k.kh << "x" << k.kw << " stride " << k.sh << "x"
            << k.sw << " pad " << k.ph << "x" << k.pw << " dilation " << k.dh << "x" << k.dw
            << " ceil " << k.ceil;
        EXPECT_TRUE(out.is_contiguous(at::MemoryFormat::ChannelsLast));
        EXPECT_EQ(out.scalar_type(), dtype);
      }
  EXPECT_EQ(pool_candidate(r, "cpu").calls, static_cast<uint64_t>(calls));
  EXPECT_TRUE(pool_candidate(r, "cpu").declined.empty());
}

/// What `cpu` leaves to ATen, with the reasons /active shows: NCHW maps, integer maps, and a
/// map that needs a gradient. The answers are at::max_pool2d's.
TEST(MaxPool2dCpu, DeclinesWhatItDoesNotServe) {
  Registry r;
  register_builtin_slots(r);
  const auto h = r.bind(kMaxPool2d, BindContext{});
  const PoolGeometry g = models::layers::square_pool(3, 2, 1);
  const auto x = at::randn({1, 8, 9, 9});
  EXPECT_TRUE(at::equal(max_pool2d(h, x, g), at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1})));
  const auto ints =
      at::randint(0, 100, {1, 8, 9, 9}, at::kInt).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(at::equal(max_pool2d(h, ints, g), at::max_pool2d(ints, {3, 3}, {2, 2}, {1, 1})));
  const auto grad = x.contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  EXPECT_TRUE(max_pool2d(h, grad, g).requires_grad());
  // A direct call of the handle, past the slot entry's checks: a zero stride is declined, not
  // divided by (it used to be, in the output size, before the parameters were checked).
  PoolGeometry zero_stride = g;
  zero_stride.stride_w = 0;
  EXPECT_FALSE(h(x.contiguous(at::MemoryFormat::ChannelsLast), zero_stride).has_value());
  // Padding above half the kernel, which the slot entry and ATen refuse (max_pool2d_problem).
  PoolGeometry wide_pad = g;
  wide_pad.pad_h = 2;
  EXPECT_EQ(max_pool2d_problem(x, wide_pad).value_or(""),
            "padding must be >= 0 and at most half the kernel size");
  EXPECT_FALSE(h(x.contiguous(at::MemoryFormat::ChannelsLast), wide_pad).has_value());
  const auto declined = pool_candidate(r, "cpu").declined;
  EXPECT_EQ(declined.at("cpu: geometry"), 2u);
  EXPECT_EQ(declined.at("cpu: channels_last input only"), 1u);
  EXPECT_EQ(declined.at("cpu: dtype (float32, bfloat16 or float16)"), 1u);
  EXPECT_EQ(declined.at("cpu: autograd (no backward)"), 1u);
  EXPECT_EQ(pool_candidate(r, "cpu").calls, 0u);
}

}  // namespace
}  // namespace libreyolo::kernels
