// CUDA kernels of the conv2d_bias_act epilogue (see bias_act_cuda.h). Elementwise and
// memory-bound: 16-byte loads and stores where the channel (channels_last) or the plane (NCHW)
// is a multiple of the vector width (else one element per step), a grid-stride loop, float32
// arithmetic, one kernel per activation.
#include "kernels/conv/cuda/bias_act_cuda.h"
#include "kernels/cuda/activate.cuh"
#include "kernels/cuda/vector_pack.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Each thread handles N consecutive elements per step of a grid-stride loop: 16 bytes, or one
// element where the shape or the pointers do not allow 16. The N elements share one channel
// (NCHW: HW % N == 0) or run over N consecutive channels (channels_last: C % N == 0). The
// channel is tracked by additions from one step to the next: a 64-bit division or modulo is a
// long software routine on the GPU, and one per element made this memory-bound pass
// compute-bound (docs/BENCHMARKS.md: "Against torch.compile, third run" before this rewrite,
// "fifth run" after it). Sum order as ATen's: ((y + bias) + residual), in float,
// rounded once.
template <typename T, int N, Activation Act>
__global__ void __launch_bounds__(kThreads)
    bias_act_kernel(T* __restrict__ y, const T* __restrict__ bias, const T* __restrict__ residual,
                    int64_t nvec, int64_t C, int64_t HW, bool channels_last) {
  constexpr bool kFast = sizeof(T) < 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= nvec) return;
  const int64_t D = step * N;  // elements per step
  // channels_last: c = element % C. NCHW: c = (element / HW) % C, o = element % HW.
  int64_t c, o = 0, dc, dq = 0, dov = 0;
  if (channels_last) {
    c = (p * N) % C;
    dc = D % C;
  } else {
    const int64_t q = (p * N) / HW;
    o = p * N - q * HW;
    c = q % C;
    dq = (D / HW) % C;
    dov = D % HW;
    dc = 0;
  }
  for (; p < nvec; p += step) {
    Pack<T, N> a = reinterpret_cast<const Pack<T, N>*>(y)[p];
    Pack<T, N> r;
    if (residual) r = reinterpret_cast<const Pack<T, N>*>(residual)[p];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float v = static_cast<float>(a.v[k]);
      if (bias) v = v + static_cast<float>(bias[channels_last ? c + k : c]);
      if (residual) v = v + static_cast<float>(r.v[k]);
      a.v[k] = static_cast<T>(activate<Act, kFast>(v));
    }
    reinterpret_cast<Pack<T, N>*>(y)[p] = a;
    if (channels_last) {
      c += dc;
      if (c >= C) c -= C;
    } else {  // c < C and dq + carry <= C: one subtraction keeps c in [0, C)
      o += dov;
      int64_t carry = dq;
      if (o >= HW) o -= HW, ++carry;
      c += carry;
      if (c >= C) c -= C;
    }
  }
}

// One kernel per activation: the switch picks the instantiation once per launch.
template <typename T, int N>
void launch(Activation act, int blocks, cudaStream_t stream, T* y, const T* bias, const T* residual,
            int64_t nvec, int64_t C, int64_t HW, bool channels_last) {
  auto run = [&](auto a) {
    bias_act_kernel<T, N, decltype(a)::value>
        <<<blocks, kThreads, 0, stream>>>(y, bias, residual, nvec, C, HW, channels_last);
  };
  using A = Activation;
  switch (act) {
    case A::none:
      return run(std::integral_constant<A, A::none>{});
    case A::relu:
      return run(std::integral_constant<A, A::relu>{});
    case A::silu:
      return run(std::integral_constant<A, A::silu>{});
    case A::gelu:
      return run(std::integral_constant<A, A::gelu>{});
    case A::tanh:
      return run(std::integral_constant<A, A::tanh>{});
  }
}

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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "bias_act_", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    auto* py = y.data_ptr<scalar_t>();
    const auto* pb = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    const auto* pr = residual.defined() ? residual.data_ptr<scalar_t>() : nullptr;
    const bool vec =
        aligned16(py) && (!pr || aligned16(pr)) && (channels_last ? C % N == 0 : HW % N == 0);
    const int64_t work = vec ? n / N : n;
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int blocks = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, sms * 8)));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) {
      launch<scalar_t, N>(act, blocks, stream, py, pb, pr, work, C, HW, channels_last);
    } else {
      launch<scalar_t, 1>(act, blocks, stream, py, pb, pr, work, C, HW, channels_last);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace libreyolo::kernels::cuda
