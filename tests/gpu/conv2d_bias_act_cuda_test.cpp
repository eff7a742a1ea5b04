// The `cuda` conv2d_bias_act epilogue (kernels/conv/cuda/bias_act_cuda.h) against ATen's own
// ops on the same convolution output: float32 equal to ((y + bias) + residual) then the
// activation (the portable path's order), float16 / bfloat16 within one rounding of the float32
// result (the kernel rounds once, ATen after every op). Both memory formats, channel counts
// with and without the 16-byte vector path, with and without bias and residual. Skips without
// a GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/conv/cuda/bias_act_cuda.h"

namespace libreyolo::kernels {
namespace {

TEST(BiasActCuda, EqualsAtenOpsInEveryLayoutAndDtype) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(7);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  int checked = 0;
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // 2^-23 (float32 noise of the comparison), else half an ulp of the dtype, doubled.
    const double rel = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
    for (auto act : {Activation::none, Activation::relu, Activation::silu, Activation::gelu,
                     Activation::tanh}) {
      for (bool channels_last : {true, false}) {
        for (int64_t C : {24, 20}) {  // 24: 16-byte path in channels_last; 20: one element per
                                      // step in 16-bit (float32's 4 divides 20)
          for (auto hw : {std::pair<int64_t, int64_t>{8, 8}, {9, 7}}) {  // 64: NCHW vector path
            for (int with = 0; with < 4; ++with) {
              const bool has_bias = with & 1, has_residual = with & 2;
              const auto format =
                  channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
              const auto y0 =
                  at::randn({2, C, hw.first, hw.second}, cuda.dtype(dtype)).contiguous(format);
              const auto bias = has_bias ? at::randn({C}, cuda.dtype(dtype)) : at::Tensor();
              const auto residual = has_residual ? at::randn_like(y0) : at::Tensor();
              auto y = y0.clone();
              cuda::bias_act_(y, bias, residual, act);
              // ATen in float32: (y + bias) + residual, then the activation, rounded once.
              auto sum = y0.to(at::kFloat);
              if (has_bias) sum = sum + bias.to(at::kFloat).view({1, C, 1, 1});
              if (has_residual) sum = sum + residual.to(at::kFloat);
              const auto ref = apply_activation(act, sum);  // the portable path's ops
              const auto diff = (y.to(at::kFloat) - ref.to(dtype).to(at::kFloat)).abs();
              const auto bound = ref.abs() * rel + 1e-6;
              const bool ok = (diff <= bound).all().item<bool>();
              EXPECT_TRUE(ok) << c10::toString(dtype) << " act " << static_cast<int>(act)
                              << (channels_last ? " channels_last" : " NCHW") << " C " << C << " "
                              << hw.first << "x" << hw.second << " bias " << has_bias
                              << " residual " << has_residual << ": max diff "
                              << diff.max().item<double>();
              EXPECT_EQ(y.is_contiguous(format), true);
              ++checked;
            }
          }
        }
      }
    }
  }
  std::cout << "[gpu] bias_act_: " << checked << " cases checked\n";
  EXPECT_EQ(checked, 3 * 5 * 2 * 2 * 2 * 4);
}

TEST(BiasActCuda, RefusesWhatItDoesNotHandle) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto strided = at::randn({2, 4, 6, 6}, cuda).transpose(2, 3);  // neither layout
  EXPECT_THROW(cuda::bias_act_(strided, at::Tensor(), at::Tensor(), Activation::silu), c10::Error);
  auto y = at::randn({2, 4, 6, 6}, cuda);
  EXPECT_THROW(cuda::bias_act_(y, at::randn({5}, cuda), at::Tensor(), Activation::silu),
               c10::Error);
  EXPECT_THROW(
      cuda::bias_act_(y, at::Tensor(),
                      at::randn({2, 4, 6, 6}, cuda).contiguous(at::MemoryFormat::ChannelsLast),
                      Activation::silu),
      c10::Error);
}

// Maps larger than one sweep of the grid (132 SMs x 8 blocks x 256 threads x 8 elements on an
// H200): every thread steps several times, so the channel the kernel carries from step to step
// (additions instead of a division per element) is checked against ATen at every element.
TEST(BiasActCuda, ManyGridStridesKeepTheChannel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(5);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const double rel = dtype == at::kFloat ? 1e-6 : 1.0 / 128;
    // channels_last C = 72 (the step is no multiple of C); NCHW C = 24, H x W = 40 x 40.
    for (bool channels_last : {true, false}) {
      const int64_t C = channels_last ? 72 : 24, H = 40, W = channels_last ? 41 : 40;
      const int64_t per_sweep = int64_t{sms} * 8 * 256 * (16 / c10::elementSize(dtype));
      const int64_t B = 3 * per_sweep / (C * H * W) + 1;  // about 3 steps per thread
      const auto format =
          channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
      const auto y0 = at::randn({B, C, H, W}, cuda.dtype(dtype)).contiguous(format);
      const auto bias = at::randn({C}, cuda.dtype(dtype));
      const auto residual = at::randn_like(y0);
      auto y = y0.clone();
      cuda::bias_act_(y, bias, residual, Activation::silu);
      const auto sum =
          (y0.to(at::kFloat) + bias.to(at::kFloat).view({1, C, 1, 1})) + residual.to(at::kFloat);
      const auto ref = at::silu(sum).to(dtype).to(at::kFloat);
      const auto diff = (y.to(at::kFloat) - ref).abs();
      EXPECT_TRUE((diff <= ref.abs() * rel + 1e-6).all().item<bool>())
          << c10::toString(dtype) << (channels_last ? " channels_last" : " NCHW") << " B " << B
          << ": max diff " << diff.max().item<double>();
    }
  }
}

}  // namespace
}  // namespace libreyolo::kernels
