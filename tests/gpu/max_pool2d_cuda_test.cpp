// The `cuda` max_pool2d (kernels/pool/cuda/max_pool2d_cuda.h) against at::max_pool2d: bit for bit
// (a max is exact) in every dtype, for the backbones' geometries and odd ones (dilation, ceil_mode,
// a window hanging over the padding), the 16-byte and the per-element paths, NaN and -inf in
// the windows, and more output rows than one grid holds. Declines (NCHW, CPU, float64) are
// counted and run nothing. Called through a registry binding, as models call it. Skips without
// a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <string>

#include "kernels/kernels.h"
#include "kernels/pool/max_pool2d.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::kernels {
namespace {

PoolGeometry geometry(int64_t k, int64_t s, int64_t p, int64_t d = 1, bool ceil = false) {
  PoolGeometry g;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = s;
  g.pad_h = g.pad_w = p;
  g.dilation_h = g.dilation_w = d;
  g.ceil_mode = ceil;
  return g;
}

at::Tensor aten(const at::Tensor& x, const PoolGeometry& g) { return max_pool2d_portable(x, g); }

TEST(MaxPool2dCuda, EqualsAtenBitForBit) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kMaxPool2d, test::cuda_context());
  ASSERT_FALSE(handle.empty());
  at::manual_seed(11);
  const std::pair<const char*, PoolGeometry> geometries[] = {
      {"3x3 s2 p1 (ResNet stem)", geometry(3, 2, 1)},
      {"2x2 s1 ceil (HGNetV2 stem)", geometry(2, 1, 0, 1, true)},
      {"3x3 s1 p1", geometry(3, 1, 1)},
      {"3x3 s2 p1 dilation 2", geometry(3, 2, 1, 2)},
      {"5x5 s3 p2 ceil", geometry(5, 3, 2, 1, true)},
      {"1x1 s2", geometry(1, 2, 0)},
  };
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t C : {64, 24, 20, 3}) {  // 16-byte path for C % (16 / size) == 0, else per element
      for (auto hw : {std::pair<int64_t, int64_t>{17, 16}, {8, 9}}) {
        for (const auto& [name, g] : geometries) {
          auto x = at::randn({2, C, hw.first, hw.second}, at::TensorOptions().device(at::kCUDA))
                       .to(dtype);
          // A NaN and a window of -inf: NaN wins its windows, -inf stays -inf (as in ATen).
          x.index_put_({0, 0, 1, 1}, std::numeric_limits<float>::quiet_NaN());
          x.index_put_({1, 1 % C, at::indexing::Slice(0, 5), at::indexing::Slice(0, 5)},
                       -std::numeric_limits<float>::infinity());
          x = x.contiguous(at::MemoryFormat::ChannelsLast);
          const auto out = handle(x, g);
          ASSERT_TRUE(out.has_value()) << name << ": the cuda implementation declined";
          const auto ref = aten(x, g);
          EXPECT_EQ(out->sizes(), ref.sizes()) << name;
          EXPECT_TRUE(out->is_contiguous(at::MemoryFormat::ChannelsLast)) << name;
          EXPECT_EQ(test::bit_mismatches(out->to(at::kFloat), ref.to(at::kFloat)), 0)
              << c10::toString(dtype) << " C " << C << " " << hw.first << "x" << hw.second << " "
              << name;
          ++checked;
        }
      }
    }
  }
  std::cout << "[gpu] max_pool2d cuda: " << checked << " cases bit-identical to at::max_pool2d\n";
  EXPECT_EQ(checked, 3 * 4 * 2 * 6);
}

TEST(MaxPool2dCuda, UnalignedStorageAndManyRowsEqualAten) {
  REQUIRE_CUDA();
  const auto handle = test::cuda_only().bind(kMaxPool2d, test::cuda_context());
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  // A channels_last view one element into its storage: not 16-byte aligned, per-element path.
  const int64_t B = 2, C = 16, H = 12, W = 10;
  const auto buffer = at::randn({B * C * H * W + 1}, cuda);
  const auto x = buffer.narrow(0, 1, B * C * H * W)
                     .view({B, H, W, C})
                     .permute({0, 3, 1, 2});  // (B, C, H, W) with channels_last strides
  ASSERT_TRUE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
  const auto out = handle(x, geometry(3, 2, 1));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(test::bit_mismatches(out->to(at::kFloat), aten(x, geometry(3, 2, 1)).to(at::kFloat)),
            0);
  // 40,000 x 3 = 120,000 output rows: more than the grid's 65,535, so blocks stride over rows.
  const auto many = at::randn({40000, 8, 2, 3}, cuda).contiguous(at::MemoryFormat::ChannelsLast);
  const auto out2 = handle(many, geometry(2, 1, 1));
  ASSERT_TRUE(out2.has_value());
  EXPECT_EQ(out2->size(2), 3);
  EXPECT_EQ(
      test::bit_mismatches(out2->to(at::kFloat), aten(many, geometry(2, 1, 1)).to(at::kFloat)), 0);
}

TEST(MaxPool2dCuda, DeclinesAreCountedAndRunNothing) {
  REQUIRE_CUDA();
  Registry reg;
  test::declare_with_cuda_only(reg);
  const auto h = reg.bind(kMaxPool2d, test::cuda_context());
  const auto x = at::randn({2, 8, 6, 6}, at::TensorOptions().device(at::kCUDA));
  EXPECT_FALSE(h(x, geometry(3, 2, 1)));  // NCHW
  EXPECT_FALSE(h(x.cpu().contiguous(at::MemoryFormat::ChannelsLast), geometry(3, 2, 1)));
  EXPECT_FALSE(h(x.to(at::kDouble).contiguous(at::MemoryFormat::ChannelsLast), geometry(3, 2, 1)));
  EXPECT_TRUE(h(x.contiguous(at::MemoryFormat::ChannelsLast), geometry(3, 2, 1)));
  // A direct call past the slot entry's checks: stride 0 would divide by zero in the output size.
  EXPECT_FALSE(h(x.contiguous(at::MemoryFormat::ChannelsLast), geometry(3, 0, 1)));
  test::expect_calls_and_declines(reg, kMaxPool2d.name, "cuda", 1,
                                  {{"cuda: not channels_last (NCHW runs at::max_pool2d)", 1},
                                   {"cuda: not a CUDA tensor", 1},
                                   {"cuda: dtype (float32, float16, bfloat16 only)", 1},
                                   {"cuda: geometry", 1}});
}

}  // namespace
}  // namespace libreyolo::kernels
