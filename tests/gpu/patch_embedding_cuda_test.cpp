// layers::Conv2dImpl::forward_patches (the ViT patch embedding as one GEMM on CUDA) against the
// convolution it replaces, on the patch sizes of the ViT backbones (14: DINOv2 base, 16: ViT,
// LW-DETR, RF-DETR nano, 4: Swin): float32 with TF32 off within float32 accumulation order
// (1e-5 of the largest output), bfloat16 within two units in the last place; the result has
// the (B, out, h, w) shape and channels_last strides. Geometries it does not take, and CPU
// tensors, run the convolution itself (bit for bit). Skips without a GPU.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "models/layers/layers.h"
#include "tests/gpu/cuda_test_util.h"

namespace libreyolo::models::layers {
namespace {

std::shared_ptr<Conv2dImpl> patch_conv(int64_t in, int64_t out, int64_t k, int64_t stride,
                                       int64_t pad) {
  Conv2dOptions o;
  o.in = in, o.out = out, o.kernel = k, o.stride = stride, o.padding = pad, o.bias = true;
  auto conv = std::make_shared<Conv2dImpl>(o);
  at::manual_seed(9);
  conv->weight.data().normal_(0, 0.05);
  conv->bias.data().normal_(0, 0.1);
  return conv;
}

TEST(PatchEmbeddingCuda, OneGemmEqualsTheConvolution) {
  REQUIRE_CUDA();
  at::NoGradGuard no_grad;
  const bool tf32 = at::globalContext().allowTF32CuBLAS();
  const bool tf32_cudnn = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  for (auto [k, side, out] : {std::tuple<int64_t, int64_t, int64_t>{14, 560, 768},
                              {16, 384, 384},
                              {16, 640, 192},
                              {4, 224, 96}}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      auto conv = patch_conv(3, out, k, k, 0);
      conv->to(at::kCUDA, dtype);
      const auto x = at::rand({2, 3, side, side}, at::TensorOptions().device(at::kCUDA)).to(dtype);
      const auto got = conv->forward_patches(x);
      const auto ref = conv->forward(x);
      ASSERT_EQ(got.sizes(), ref.sizes());
      EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
      const double scale = ref.abs().max().item<double>();
      const double tol = dtype == at::kFloat ? 1e-5 : 2.0 / 128;
      EXPECT_LE(test::max_abs_diff(got, ref), tol * std::max(1.0, scale))
          << "k=" << k << " side=" << side << " " << dtype;
    }
  }
  at::globalContext().setAllowTF32CuBLAS(tf32);
  at::globalContext().setAllowTF32CuDNN(tf32_cudnn);
}

TEST(PatchEmbeddingCuda, OtherGeometriesAndCpuRunTheConvolution) {
  REQUIRE_CUDA();
  at::NoGradGuard no_grad;
  const auto x = at::rand({1, 3, 32, 32});
  auto conv = patch_conv(3, 8, 4, 4, 0);
  EXPECT_TRUE(at::equal(conv->forward_patches(x), conv->forward(x)));  // CPU
  conv->to(at::kCUDA);
  const auto odd = at::rand({1, 3, 30, 32}, at::TensorOptions().device(at::kCUDA));  // 30 % 4
  EXPECT_TRUE(at::equal(conv->forward_patches(odd), conv->forward(odd)));
  auto padded = patch_conv(3, 8, 4, 4, 1);
  padded->to(at::kCUDA);
  const auto xc = x.to(at::kCUDA);
  EXPECT_TRUE(at::equal(padded->forward_patches(xc), padded->forward(xc)));
  auto strided = patch_conv(3, 8, 4, 2, 0);
  strided->to(at::kCUDA);
  EXPECT_TRUE(at::equal(strided->forward_patches(xc), strided->forward(xc)));
}

}  // namespace
}  // namespace libreyolo::models::layers
