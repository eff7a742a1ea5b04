// CUDA kernel of the conv2d_bias_act epilogue (see bias_act_cuda.h). Elementwise and
// memory-bound: 16-byte loads and stores where the channel (channels_last) or the plane (NCHW)
// is a multiple of the vector width, a grid-stride loop, float32 arithmetic.
#include "kernels/conv/cuda/bias_act_cuda.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, int N>
struct alignas(16) Pack {
  T v[N];
};

// The activations as ATen computes them in float
// (aten/src/ATen/native/cuda/ActivationSiluKernel.cu, ActivationGeluCore.cu,
// UnaryGeometricTanhKernel.cu); relu keeps a NaN like at::relu.
__device__ __forceinline__ float activate(float x, int act) {
  switch (act) {
    case 1:
      return x <= 0.f ? 0.f : x;
    case 2:
      return x / (1.f + expf(-x));
    case 3:
      return x * 0.5f * (1.f + erff(x * 0.70710678118654752440f));
    case 4:
      return tanhf(x);
    default:
      return x;
  }
}

// One element: ((y + b) + r) in float, as ATen's add_(bias) then add_(residual) in float32.
template <typename T>
__device__ __forceinline__ T epilogue(T y, const T* bias, int64_t c, const T* residual, T r,
                                      int act) {
  float v = static_cast<float>(y);
  if (bias) v = v + static_cast<float>(bias[c]);
  if (residual) v = v + static_cast<float>(r);
  return static_cast<T>(activate(v, act));
}

// channels_last: channel = i % C; NCHW: channel = (i / HW) % C. `vec`: N consecutive elements
// share the vector's alignment and (NCHW) one channel, or (channels_last) C % N == 0.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    bias_act_kernel(T* __restrict__ y, const T* __restrict__ bias, const T* __restrict__ residual,
                    int64_t n, int64_t C, int64_t HW, bool channels_last, bool vec, int act) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = vec ? n / N : 0;
  for (int64_t p = tid; p < nvec; p += stride) {
    const int64_t i0 = p * N;
    Pack<T, N> a = reinterpret_cast<const Pack<T, N>*>(y)[p];
    Pack<T, N> r;
    if (residual) r = reinterpret_cast<const Pack<T, N>*>(residual)[p];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t c = channels_last ? (i0 + k) % C : (i0 / HW) % C;
      a.v[k] = epilogue(a.v[k], bias, c, residual, residual ? r.v[k] : T(0), act);
    }
    reinterpret_cast<Pack<T, N>*>(y)[p] = a;
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    const int64_t c = channels_last ? i % C : (i / HW) % C;
    y[i] = epilogue(y[i], bias, c, residual, residual ? residual[i] : T(0), act);
  }
}

int activation_code(Activation act) {
  switch (act) {
    case Activation::none:
      return 0;
    case Activation::relu:
      return 1;
    case Activation::silu:
      return 2;
    case Activation::gelu:
      return 3;
    case Activation::tanh:
      return 4;
  }
  return 0;
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void bias_act_(at::Tensor& y, const at::Tensor& bias, const at::Tensor& residual, Activation act) {
  TORCH_CHECK(y.is_cuda() && y.dim() == 4, "bias_act_: y must be a (B, C, H, W) CUDA tensor");
  const bool channels_last = y.is_contiguous(at::MemoryFormat::ChannelsLast);
  TORCH_CHECK(channels_last || y.is_contiguous(),
              "bias_act_: y must be contiguous in channels_last or NCHW");
  const int64_t C = y.size(1), HW = y.size(2) * y.size(3), n = y.numel();
  if (bias.defined())
    TORCH_CHECK(bias.is_cuda() && bias.dim() == 1 && bias.size(0) == C &&
                    bias.scalar_type() == y.scalar_type() && bias.is_contiguous(),
                "bias_act_: bias must be (C) of y's dtype on its device");
  if (residual.defined())
    TORCH_CHECK(residual.sizes() == y.sizes() && residual.strides() == y.strides() &&
                    residual.scalar_type() == y.scalar_type() && residual.device() == y.device(),
                "bias_act_: residual must have y's sizes, strides, dtype and device");
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(y.device());
  const int code = activation_code(act);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "bias_act_", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    auto* py = y.data_ptr<scalar_t>();
    const auto* pb = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    const auto* pr = residual.defined() ? residual.data_ptr<scalar_t>() : nullptr;
    const bool vec =
        aligned(py) && (!pr || aligned(pr)) && (channels_last ? C % N == 0 : HW % N == 0);
    const int64_t work = vec ? n / N : n;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, sms * 8)));
    bias_act_kernel<scalar_t, N><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        py, pb, pr, n, C, HW, channels_last, vec, code);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace libreyolo::kernels::cuda
