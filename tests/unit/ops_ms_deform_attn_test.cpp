// ms_deform_attn: portable math against the grid_sample fixtures (forward and gradients), zero
// padding, level_start_index, slot routing through a bound handle, RT-DETRv2 variants.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/registry.h"
#include "ops_safetensors_util.h"

namespace libreyolo::kernels {

/// Defined in kernels/attention/cpu/ms_deform_attn_cpu.cpp (kernels/builtin.cpp calls it).
void register_ms_deform_attn_cpu(Registry& registry);

namespace {

using test::fixture_path;
using test::load_safetensors;
using test::max_abs_diff;
using test::max_rel_diff;

/// Level sizes of a fixture's (L, 2) spatial_shapes tensor.
SpatialShapes shapes_of(const at::Tensor& t) {
  SpatialShapes shapes;
  for (int64_t l = 0; l < t.size(0); ++l) {
    shapes.push_back({t[l][0].item<int64_t>(), t[l][1].item<int64_t>()});
  }
  return shapes;
}

/// Each test has its own registry with the slot declared; handle_ is empty (the portable path)
/// until register_mock binds one, as load_model binds a model.
class OpsMsDeformAttn : public ::testing::Test {
 protected:
  void SetUp() override { registry_.declare(kMsDeformAttn); }

  /// Registers a "mock" implementation returning all 7s (or declining) that records the shapes
  /// of every call, and binds handle_ to it.
  void register_mock(bool decline) {
    registry_.register_impl(
        kMsDeformAttn, "mock",
        MsDeformAttnImpl{[this, decline](const at::Tensor& value, const at::Tensor& shapes,
                                         const at::Tensor& start, const at::Tensor& locs,
                                         const at::Tensor& weights) -> Outcome<at::Tensor> {
          calls_.push_back({value.sizes().vec(), shapes.sizes().vec(), start.sizes().vec(),
                            locs.sizes().vec(), weights.sizes().vec()});
          last_shapes_ = shapes.clone();
          last_start_ = start.clone();
          last_locs_ = locs.clone();
          last_weights_ = weights.clone();
          if (decline) return Decline{"mock declines"};
          return at::full({value.size(0), locs.size(1), value.size(2) * value.size(3)}, 7.0,
                          value.options());
        }});
    handle_ = registry_.bind(kMsDeformAttn, BindContext{});
  }

  Registry registry_;
  MsDeformAttnHandle handle_;
  std::vector<std::vector<std::vector<int64_t>>> calls_;
  at::Tensor last_shapes_, last_start_, last_locs_, last_weights_;
};

/// The canonical inputs (B=2, S=30, H=2, C=4, shapes (4,6),(2,3), Q=3, P=2).
std::map<std::string, at::Tensor> canonical() {
  return load_safetensors(fixture_path("ops/ms_deform_attn_canonical.safetensors"));
}

TEST_F(OpsMsDeformAttn, ForwardMatchesGridSampleFixtures) {
  for (const char* name : {"canonical", "rtdetr_like"}) {
    auto f =
        load_safetensors(fixture_path(std::string("ops/ms_deform_attn_") + name + ".safetensors"));
    const auto shapes = shapes_of(f.at("spatial_shapes"));
    // The slot entry (nothing registered: portable) and the portable path alone.
    auto out = ms_deform_attn(handle_, f.at("value"), shapes, f.at("sampling_locations"),
                              f.at("attention_weights"));
    auto portable = ms_deform_attn_portable(f.at("value"), shapes, f.at("sampling_locations"),
                                            f.at("attention_weights"));
    ASSERT_EQ(out.sizes(), f.at("output_f32").sizes());
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    const double err64 = max_abs_diff(out, f.at("output_f64"));
    const double err32 = max_abs_diff(out, f.at("output_f32"));
    std::cout << "[ms_deform_attn " << name << "] max|out - output_f64| = " << err64
              << ", max|out - output_f32| = " << err32 << "\n";
    EXPECT_LE(err64, 1e-5);
    EXPECT_LE(err32, 1e-6);
    EXPECT_TRUE(at::equal(out, portable));
  }
}

TEST_F(OpsMsDeformAttn, GradientsMatchFloat64Fixtures) {
  for (const char* name : {"canonical", "rtdetr_like"}) {
    auto f =
        load_safetensors(fixture_path(std::string("ops/ms_deform_attn_") + name + ".safetensors"));
    const auto shapes = shapes_of(f.at("spatial_shapes"));
    auto value = f.at("value").clone().requires_grad_(true);
    auto locs = f.at("sampling_locations").clone().requires_grad_(true);
    auto weights = f.at("attention_weights").clone().requires_grad_(true);
    auto out = ms_deform_attn(handle_, value, shapes, locs, weights);
    out.backward(f.at("grad_output_f32"));
    const double rv = max_rel_diff(value.grad(), f.at("grad_value_f64"));
    const double rl = max_rel_diff(locs.grad(), f.at("grad_sampling_locations_f64"));
    const double rw = max_rel_diff(weights.grad(), f.at("grad_attention_weights_f64"));
    std::cout << "[ms_deform_attn " << name << "] relative grad error (max|a-b|/max|b|): value "
              << rv << ", sampling_locations " << rl << ", attention_weights " << rw << "\n";
    EXPECT_LE(rv, 1e-4);
    EXPECT_LE(rl, 1e-4);
    EXPECT_LE(rw, 1e-4);
  }
}

TEST_F(OpsMsDeformAttn, LocationsOutsideTheMapReadZeros) {
  // One level 2x2 (H=2, W=2), B=1, H=1 head, C=1; value = [[1, 2], [3, 4]] row-major.
  auto value = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4, 1, 1});
  // Pixel coordinate = loc * size - 0.5.
  // p0 (0.25, 0.25) -> pixel (0, 0): exactly value[0][0] = 1.
  // p1 (0.0, 0.25)  -> pixel (-0.5, 0): half of column 0 (1 * 0.5), half outside -> 0.5.
  // p2 (-0.5, 0.5)  -> pixel (-1.5, 0.5): every corner outside -> 0.
  // p3 (0.75, 1.5)  -> pixel (1, 2.5): every corner below the map -> 0.
  auto locs =
      at::tensor({0.25f, 0.25f, 0.0f, 0.25f, -0.5f, 0.5f, 0.75f, 1.5f}).view({1, 1, 1, 1, 4, 2});
  auto weights = at::tensor({1.0f, 10.0f, 100.0f, 1000.0f}).view({1, 1, 1, 1, 4});
  auto out = ms_deform_attn(handle_, value, {{2, 2}}, locs, weights);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(out.item<float>(), 1.0f * 1 + 10.0f * 0.5f);  // 6 exactly
  // Each point alone, to see the zeros themselves.
  auto only = [&](int p) {
    auto w = at::zeros_like(weights);
    w[0][0][0][0][p] = 1.0f;
    return ms_deform_attn(handle_, value, {{2, 2}}, locs, w).item<float>();
  };
  EXPECT_EQ(only(2), 0.0f);
  EXPECT_EQ(only(3), 0.0f);
}

TEST_F(OpsMsDeformAttn, LevelStartIndexAndShapesTensor) {
  auto start = level_start_index({{4, 6}, {2, 3}}, at::kCPU);
  EXPECT_EQ(start.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(start, at::tensor(std::vector<int64_t>{0, 24})));
  auto shapes = spatial_shapes_tensor({{4, 6}, {2, 3}}, at::kCPU);
  EXPECT_EQ(shapes.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(shapes, at::tensor(std::vector<int64_t>{4, 6, 2, 3}).view({2, 2})));
  // Cached: the same tensor again.
  EXPECT_TRUE(spatial_shapes_tensor({{4, 6}, {2, 3}}, at::kCPU).is_same(shapes));
  EXPECT_THROW(level_start_index({}, at::kCPU), c10::Error);
  EXPECT_THROW(level_start_index({{0, 3}}, at::kCPU), c10::Error);
}

TEST_F(OpsMsDeformAttn, RejectsMalformedShapesWithNamedErrors) {
  auto f = canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto v = f.at("value"), l = f.at("sampling_locations"), w = f.at("attention_weights");
  expect_error([&] { ms_deform_attn(handle_, v.narrow(1, 0, 29), shapes, l, w); },
               "value.size(1) = 29");
  expect_error([&] { ms_deform_attn(handle_, v, shapes, l.narrow(4, 0, 1), w); },
               "attention_weights");
  expect_error([&] { ms_deform_attn(handle_, v, shapes, l.select(5, 0), w); },
               "sampling_locations");
  expect_error([&] { ms_deform_attn(handle_, v, {{4, 6}}, l, w); }, "value.size(1)");
  expect_error([&] { ms_deform_attn(handle_, v.to(at::kLong), shapes, l, w); }, "value must be");
  expect_error([&] { ms_deform_attn(handle_, v[0], shapes, l, w); }, "value must be (B, S, H, C)");
}

TEST_F(OpsMsDeformAttn, SlotRoutesToRegisteredImplementation) {
  auto f = canonical();
  register_mock(/*decline=*/false);
  ASSERT_EQ(registry_.resolve(kMsDeformAttn.name), std::optional<std::string>("mock"));
  auto out = ms_deform_attn(handle_, f.at("value"), {{4, 6}, {2, 3}}, f.at("sampling_locations"),
                            f.at("attention_weights"));
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0][0], (std::vector<int64_t>{2, 30, 2, 4}));
  EXPECT_EQ(calls_[0][1], (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(calls_[0][2], (std::vector<int64_t>{2}));
  EXPECT_EQ(calls_[0][3], (std::vector<int64_t>{2, 3, 2, 2, 2, 2}));
  EXPECT_EQ(calls_[0][4], (std::vector<int64_t>{2, 3, 2, 2, 2}));
  EXPECT_TRUE(at::equal(last_shapes_, f.at("spatial_shapes")));
  EXPECT_TRUE(at::equal(last_start_, f.at("level_start_index")));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 8}));
  EXPECT_TRUE(at::equal(out, at::full({2, 3, 8}, 7.0f)));
  // The portable path alone never reaches the slot.
  ms_deform_attn_portable(f.at("value"), {{4, 6}, {2, 3}}, f.at("sampling_locations"),
                          f.at("attention_weights"));
  EXPECT_EQ(calls_.size(), 1u);
}

TEST_F(OpsMsDeformAttn, DeclineFallsBackToPortableAndIsCounted) {
  auto f = canonical();
  register_mock(/*decline=*/true);
  auto out = ms_deform_attn(handle_, f.at("value"), {{4, 6}, {2, 3}}, f.at("sampling_locations"),
                            f.at("attention_weights"));
  EXPECT_EQ(calls_.size(), 1u);
  EXPECT_TRUE(at::equal(
      out, ms_deform_attn_portable(f.at("value"), {{4, 6}, {2, 3}}, f.at("sampling_locations"),
                                   f.at("attention_weights"))));
  EXPECT_LE(max_abs_diff(out, f.at("output_f32")), 1e-6);
  bool found = false;
  for (const auto& slot : registry_.report()) {
    if (slot.slot != kMsDeformAttn.name) continue;
    for (const auto& c : slot.candidates) {
      if (c.name != "mock") continue;
      found = true;
      EXPECT_EQ(c.calls, 0u);
      ASSERT_EQ(c.declined.count("mock declines"), 1u);
      EXPECT_EQ(c.declined.at("mock declines"), 1u);
    }
  }
  EXPECT_TRUE(found);
}

/// The canonical inputs in RT-DETRv2's flat layout: locs (B, Q, H, L*P, 2), weights (B, Q, H,
/// L*P).
struct Flat {
  at::Tensor value, locs, weights;
};
Flat flat_canonical() {
  auto f = canonical();
  return {f.at("value"), f.at("sampling_locations").flatten(3, 4),
          f.at("attention_weights").flatten(3, 4)};
}

TEST_F(OpsMsDeformAttn, V2EqualPointsBilinearReachesSlotInClassicLayout) {
  auto in = flat_canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  // Without a mock: the same numbers as the classic portable path.
  auto f = canonical();
  auto plain = ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {2, 2},
                                 SamplingMethod::bilinear);
  EXPECT_TRUE(
      at::equal(plain, ms_deform_attn_portable(f.at("value"), shapes, f.at("sampling_locations"),
                                               f.at("attention_weights"))));
  register_mock(/*decline=*/false);
  auto out = ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {2, 2},
                               SamplingMethod::bilinear);
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0][3], (std::vector<int64_t>{2, 3, 2, 2, 2, 2}));
  EXPECT_EQ(calls_[0][4], (std::vector<int64_t>{2, 3, 2, 2, 2}));
  EXPECT_TRUE(at::equal(out, at::full({2, 3, 8}, 7.0f)));
}

TEST_F(OpsMsDeformAttn, V2DiscreteNeverReachesSlotRaggedReachesItPadded) {
  auto in = flat_canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  // Ragged [1, 3]: same 4 points per (b, q, h), split differently across levels. Unbound: the
  // per-level portable math, the sum over levels of the classic op run on each level alone.
  const auto ragged = ms_deform_attn_v2(MsDeformAttnHandle{}, in.value, shapes, in.locs, in.weights,
                                        {1, 3}, SamplingMethod::bilinear);
  EXPECT_EQ(ragged.sizes(), (std::vector<int64_t>{2, 3, 8}));
  const std::vector<int64_t> points = {1, 3};
  at::Tensor expected;
  int64_t start = 0, first_point = 0;
  for (size_t l = 0; l < shapes.size(); ++l) {
    const int64_t hw = shapes[l][0] * shapes[l][1], p = points[l];
    auto part = ms_deform_attn_portable(in.value.narrow(1, start, hw), {shapes[l]},
                                        in.locs.narrow(3, first_point, p).unsqueeze(3),
                                        in.weights.narrow(3, first_point, p).unsqueeze(3));
    expected = expected.defined() ? expected + part : part;
    start += hw;
    first_point += p;
  }
  const double err = max_abs_diff(ragged, expected);
  std::cout << "[ms_deform_attn_v2 ragged [1,3]] max|out - per-level portable| = " << err << "\n";
  EXPECT_LE(err, 1e-6);

  register_mock(/*decline=*/false);
  for (auto method : {SamplingMethod::discrete, SamplingMethod::discrete_per_axis}) {
    auto out = ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {2, 2}, method);
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 8}));
    EXPECT_FALSE(at::equal(out, at::full({2, 3, 8}, 7.0f)));
  }
  EXPECT_TRUE(calls_.empty());
  // Bound: ragged reaches the slot once, every level padded to 3 points (weight 0).
  const auto padded = ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {1, 3},
                                        SamplingMethod::bilinear);
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0][3], (std::vector<int64_t>{2, 3, 2, 2, 3, 2}));
  EXPECT_EQ(calls_[0][4], (std::vector<int64_t>{2, 3, 2, 2, 3}));
  EXPECT_TRUE(at::equal(padded, at::full({2, 3, 8}, 7.0f)));
  // The padding: level 0's one point then two at (0.5, 0.5) with weight 0; level 1's three.
  EXPECT_TRUE(at::equal(last_locs_.select(3, 0).narrow(3, 0, 1), in.locs.narrow(3, 0, 1)));
  EXPECT_TRUE(at::equal(last_locs_.select(3, 0).narrow(3, 1, 2), at::full({2, 3, 2, 2, 2}, 0.5f)));
  EXPECT_TRUE(at::equal(last_locs_.select(3, 1), in.locs.narrow(3, 1, 3)));
  EXPECT_TRUE(at::equal(last_weights_.select(3, 0).narrow(3, 0, 1), in.weights.narrow(3, 0, 1)));
  EXPECT_TRUE(at::equal(last_weights_.select(3, 0).narrow(3, 1, 2), at::zeros({2, 3, 2, 2})));
  EXPECT_TRUE(at::equal(last_weights_.select(3, 1), in.weights.narrow(3, 1, 3)));
}

TEST_F(OpsMsDeformAttn, V2RaggedPaddedKeepsGradients) {
  // Bound but declining (as the cpu implementation declines under autograd): the portable math
  // runs on the padded tensors, and the gradients of the locations and weights reach the caller
  // as they do through the unbound per-level path.
  auto in = flat_canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  register_mock(/*decline=*/true);
  auto locs = in.locs.clone().requires_grad_(), weights = in.weights.clone().requires_grad_();
  ms_deform_attn_v2(handle_, in.value, shapes, locs, weights, {1, 3}, SamplingMethod::bilinear)
      .sum()
      .backward();
  auto ref_locs = in.locs.clone().requires_grad_(),
       ref_weights = in.weights.clone().requires_grad_();
  ms_deform_attn_v2(MsDeformAttnHandle{}, in.value, shapes, ref_locs, ref_weights, {1, 3},
                    SamplingMethod::bilinear)
      .sum()
      .backward();
  ASSERT_TRUE(locs.grad().defined());
  ASSERT_TRUE(weights.grad().defined());
  EXPECT_GT(weights.grad().abs().sum().item<double>(), 0.0);
  EXPECT_LE(max_abs_diff(locs.grad(), ref_locs.grad()), 1e-5);
  EXPECT_LE(max_abs_diff(weights.grad(), ref_weights.grad()), 1e-5);
}

TEST_F(OpsMsDeformAttn, V2DiscreteGathersNearestPixel) {
  // One level H=2, W=3, B=1, one head, C=2: value[y][x][c] = 10 * (y * 3 + x) + c.
  auto value =
      (at::arange(6, at::kFloat).view({6, 1}) * 10 + at::arange(2, at::kFloat)).view({1, 6, 1, 2});
  // coord = int64(loc * (W, H) + 0.5), truncated toward zero:
  // p0 (0.4, 0.6):   x = int(1.7) = 1, y = int(1.7) = 1             -> pixel 4
  // p1 (-0.3, 0.2):  x = int(-0.4) = 0, y = int(0.9) = 0            -> pixel 0
  // p2 (0.9, 0.3):   x = int(3.2) = 3, y = int(1.1) = 1. discrete clamps x by H-1 = 1 ->
  //                  pixel 1 * 3 + 1 = 4; per axis clamps x by W-1 = 2 -> pixel 5.
  // p3 (0.7, -2.0):  x = int(2.6) = 2, y = int(-3.5) = -3 -> 0. discrete: x -> 1, pixel 1;
  //                  per axis: x stays 2, pixel 2.
  auto locs = at::tensor({0.4f, 0.6f, -0.3f, 0.2f, 0.9f, 0.3f, 0.7f, -2.0f}).view({1, 1, 1, 4, 2});
  auto weights = at::tensor({1.0f, 0.5f, 0.25f, 2.0f}).view({1, 1, 1, 4});
  auto pixel_value = [](int pixel, int c) { return 10.0f * pixel + c; };
  auto expected = [&](std::vector<int> pixels) {
    std::vector<float> out;
    for (int c = 0; c < 2; ++c) {
      out.push_back(1.0f * pixel_value(pixels[0], c) + 0.5f * pixel_value(pixels[1], c) +
                    0.25f * pixel_value(pixels[2], c) + 2.0f * pixel_value(pixels[3], c));
    }
    return at::tensor(out).view({1, 1, 2});
  };
  auto discrete =
      ms_deform_attn_v2(handle_, value, {{2, 3}}, locs, weights, {4}, SamplingMethod::discrete);
  auto per_axis = ms_deform_attn_v2(handle_, value, {{2, 3}}, locs, weights, {4},
                                    SamplingMethod::discrete_per_axis);
  std::cout << "[ms_deform_attn_v2 discrete] " << discrete << " per-axis " << per_axis << "\n";
  EXPECT_TRUE(at::allclose(discrete, expected({4, 0, 4, 1}), 0, 1e-5));
  EXPECT_TRUE(at::allclose(per_axis, expected({4, 0, 5, 2}), 0, 1e-5));
}

TEST_F(OpsMsDeformAttn, V2RejectsMismatchedPointCounts) {
  auto in = flat_canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  EXPECT_THROW(ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {1, 1, 1, 1},
                                 SamplingMethod::bilinear),
               c10::Error);
  EXPECT_THROW(ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {},
                                 SamplingMethod::bilinear),
               c10::Error);
  EXPECT_THROW(ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {1, 2},
                                 SamplingMethod::discrete),
               c10::Error);
  EXPECT_THROW(ms_deform_attn_v2(handle_, in.value, shapes, in.locs, in.weights, {0, 4},
                                 SamplingMethod::bilinear),
               c10::Error);
}

TEST_F(OpsMsDeformAttn, HalfValueComputesInItsDtype) {
  auto f = canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    auto out = ms_deform_attn(handle_, f.at("value").to(dtype), shapes, f.at("sampling_locations"),
                              f.at("attention_weights"));
    EXPECT_EQ(out.scalar_type(), dtype);
    const double err = max_abs_diff(out, f.at("output_f64"));
    std::cout << "[ms_deform_attn " << dtype << "] max|out - output_f64| = " << err << "\n";
    EXPECT_LE(err, dtype == at::kHalf ? 1e-2 : 5e-2);
  }
}

/// 16-bit values on the CPU sample like float32: LibTorch 2.11's vectorized bfloat16/float16 CPU
/// grid_sampler gathers wrong pixels (1.16 off here) and read outside the input in the daemon.
/// RT-DETR's decoder shapes (3 levels 40/20/10, 8 heads of 32, 300 queries, 4 points) with every
/// location a multiple of 1/64, so 2 * loc - 1 is exact in bfloat16 and both sides sample the
/// same coordinates: what remains is the 16-bit rounding of the result and of the weighted sum.
TEST_F(OpsMsDeformAttn, SixteenBitCpuSamplesLikeFloat32) {
  at::manual_seed(7);
  const SpatialShapes shapes = {{40, 40}, {20, 20}, {10, 10}};
  const int64_t S = 40 * 40 + 20 * 20 + 10 * 10, H = 8, C = 32, Q = 300, L = 3, P = 4;
  const auto value = at::randn({1, S, H, C});
  const auto locs = at::randint(-4, 69, {1, Q, H, L, P, 2}).to(at::kFloat) / 64.0;  // some outside
  const auto weights = at::softmax(at::randn({1, Q, H, L * P}), -1).reshape({1, Q, H, L, P});
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto v16 = value.to(dtype), w16 = weights.to(dtype);
    const auto out = ms_deform_attn(handle_, v16, shapes, locs, weights);
    const auto expected =
        ms_deform_attn(handle_, v16.to(at::kFloat), shapes, locs, w16.to(at::kFloat));
    ASSERT_EQ(out.scalar_type(), dtype);
    const double err = max_abs_diff(out.to(at::kFloat), expected);
    std::cout << "[ms_deform_attn " << dtype
              << " cpu] max|out - float32 of the same inputs| = " << err << "\n";
    EXPECT_LE(err, dtype == at::kHalf ? 2e-3 : 2e-2);
  }
}

/// The `cpu` implementation (kernels/attention/cpu/ms_deform_attn_cpu.cpp) bound as a CPU model
/// binds it.
class OpsMsDeformAttnCpu : public OpsMsDeformAttn {
 protected:
  void SetUp() override {
    OpsMsDeformAttn::SetUp();
    register_ms_deform_attn_cpu(registry_);
    handle_ = registry_.bind(kMsDeformAttn, BindContext{});
  }
  /// The `cpu` candidate's report.
  CandidateReport candidate() {
    for (const auto& slot : registry_.report())
      if (slot.slot == kMsDeformAttn.name)
        for (const auto& c : slot.candidates)
          if (c.name == "cpu") return c;
    ADD_FAILURE() << "no cpu candidate";
    return {};
  }
};

// The fixtures (grid_sample in float64 and float32) and the portable path, within float32
// rounding (the sums run in another order); served by `cpu`, not declined.
TEST_F(OpsMsDeformAttnCpu, MatchesTheFixturesAndThePortablePath) {
  const at::NoGradGuard no_grad;
  for (const char* name : {"canonical", "rtdetr_like"}) {
    auto f =
        load_safetensors(fixture_path(std::string("ops/ms_deform_attn_") + name + ".safetensors"));
    const auto shapes = shapes_of(f.at("spatial_shapes"));
    const auto out = ms_deform_attn(handle_, f.at("value"), shapes, f.at("sampling_locations"),
                                    f.at("attention_weights"));
    const auto portable = ms_deform_attn_portable(f.at("value"), shapes, f.at("sampling_locations"),
                                                  f.at("attention_weights"));
    ASSERT_EQ(out.sizes(), f.at("output_f32").sizes());
    const double err64 = max_abs_diff(out, f.at("output_f64"));
    const double err_portable = max_abs_diff(out, portable);
    std::cout << "[ms_deform_attn cpu " << name << "] max|out - output_f64| = " << err64
              << ", max|out - portable| = " << err_portable << "\n";
    EXPECT_LE(err64, 1e-5);
    EXPECT_LE(err_portable, 1e-6);
  }
  EXPECT_EQ(candidate().calls, 2u);
  EXPECT_TRUE(candidate().declined.empty());
}

// Zero padding outside the map, as grid_sample's; a NaN location adds nothing (never an index).
TEST_F(OpsMsDeformAttnCpu, OutsideTheMapAndNanLocationsReadZeros) {
  const at::NoGradGuard no_grad;
  auto value = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4, 1, 1});
  auto locs =
      at::tensor({0.25f, 0.25f, 0.0f, 0.25f, -0.5f, 0.5f, NAN, 0.5f}).view({1, 1, 1, 1, 4, 2});
  auto weights = at::tensor({1.0f, 10.0f, 100.0f, 1000.0f}).view({1, 1, 1, 1, 4});
  const auto out = ms_deform_attn(handle_, value, {{2, 2}}, locs, weights);
  EXPECT_EQ(out.item<float>(), 1.0f * 1 + 10.0f * 0.5f);  // 6 exactly, as the portable path
  EXPECT_EQ(candidate().calls, 1u);
}

// float16 / bfloat16 values accumulate in float32 and round once: within one rounding of the
// float32 result of the same inputs (RT-DETR decoder shapes, as SixteenBitCpuSamplesLikeFloat32).
TEST_F(OpsMsDeformAttnCpu, SixteenBitRoundsOnce) {
  const at::NoGradGuard no_grad;
  at::manual_seed(7);
  const SpatialShapes shapes = {{40, 40}, {20, 20}, {10, 10}};
  const int64_t S = 40 * 40 + 20 * 20 + 10 * 10, H = 8, C = 32, Q = 300, L = 3, P = 4;
  const auto value = at::randn({1, S, H, C});
  const auto locs = at::randint(-4, 69, {1, Q, H, L, P, 2}).to(at::kFloat) / 64.0;
  const auto weights = at::softmax(at::randn({1, Q, H, L * P}), -1).reshape({1, Q, H, L, P});
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto v16 = value.to(dtype);
    const auto out = ms_deform_attn(handle_, v16, shapes, locs, weights);
    ASSERT_EQ(out.scalar_type(), dtype);
    const auto expected = ms_deform_attn_portable(v16.to(at::kFloat), shapes, locs, weights);
    const double err = max_abs_diff(out.to(at::kFloat), expected);
    const double scale = expected.abs().max().item<double>();
    std::cout << "[ms_deform_attn cpu " << dtype << "] max|out - float32| = " << err
              << " (max |out| " << scale << ")\n";
    EXPECT_LE(err, scale * (dtype == at::kHalf ? 1e-3 : 4e-3));
  }
  EXPECT_EQ(candidate().calls, 2u);
}

// What it cannot do is declined with the reason counted, and the portable path answers:
// a gradient, float64, metadata that does not describe value (only reachable by calling the
// handle directly: the slot entry builds it from checked shapes).
TEST_F(OpsMsDeformAttnCpu, DeclinesAndThePortablePathAnswers) {
  auto f = canonical();
  const SpatialShapes shapes = {{4, 6}, {2, 3}};
  auto value = f.at("value").clone().requires_grad_(true);
  auto out =
      ms_deform_attn(handle_, value, shapes, f.at("sampling_locations"), f.at("attention_weights"));
  EXPECT_TRUE(out.requires_grad());
  EXPECT_EQ(candidate().declined.at("cpu: autograd (no backward)"), 1u);
  const at::NoGradGuard no_grad;
  const auto f64 = ms_deform_attn(handle_, f.at("value").to(at::kDouble), shapes,
                                  f.at("sampling_locations"), f.at("attention_weights"));
  EXPECT_LE(max_abs_diff(f64, f.at("output_f64")), 1e-12);
  EXPECT_EQ(candidate().declined.at("cpu: dtype (float32, bfloat16 or float16)"), 1u);
  const auto bad_shapes = at::tensor({4, 6, 2, 4}, at::kLong).view({2, 2});  // S = 32, not 30
  const auto bad = handle_(f.at("value"), bad_shapes, level_start_index(shapes, at::kCPU),
                           f.at("sampling_locations"), f.at("attention_weights"));
  EXPECT_FALSE(bad.has_value());
  EXPECT_EQ(candidate().declined.at("cpu: malformed spatial metadata"), 1u);
  const auto one_batch =
      handle_(f.at("value").narrow(0, 0, 1), spatial_shapes_tensor(shapes, at::kCPU),
              level_start_index(shapes, at::kCPU), f.at("sampling_locations"),
              f.at("attention_weights"));  // locations of 2 batches
  EXPECT_FALSE(one_batch.has_value());
  EXPECT_EQ(candidate().declined.at("cpu: shape mismatch"), 1u);
  EXPECT_EQ(candidate().calls, 0u);
}

}  // namespace
}  // namespace libreyolo::kernels
