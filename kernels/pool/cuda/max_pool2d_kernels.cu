// CUDA kernel of the `cuda` max_pool2d (see max_pool2d_cuda.h). Memory-bound: each thread reads
// the window of one output pixel for N channels (16-byte loads when C % N == 0 and the pointers
// are aligned) and writes them once; neighbouring windows overlap in L1/L2, so the map is read
// from DRAM about once. No indices are written.
#include "kernels/cuda/vector_pack.cuh"
#include "kernels/pool/cuda/max_pool2d_cuda.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct Geometry {
  int64_t H, W, OH, OW, C;
  int kh, kw, sh, sw, ph, pw, dh, dw;
};

// Each thread: one output pixel's N channels (channels_last offsets). ATen's rule
// (aten/src/ATen/native/cuda/DilatedMaxPool2d.cu): a value replaces the max when it is greater
// or NaN; the max starts at -inf, so a window of -inf gives -inf. Grid: y over output rows
// (b, oh), striding when there are more than 65,535; x over one row's OW * C / N (pixel,
// channel group) items, one per thread, channel groups fastest so that a warp reads
// consecutive 16-byte vectors. Within a row the indices are 32-bit (a 64-bit division is a long
// software routine on the GPU).
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, Geometry g) {
  const int cv = static_cast<int>(g.C / N);  // channel groups per pixel
  const int row_len = static_cast<int>(g.OW) * cv;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t b = row / g.OH, oh = row - b * g.OH;
    const int64_t h0 = oh * g.sh - g.ph;
    const T* plane = x + b * g.H * g.W * g.C;
    T* out_row = y + row * g.OW * g.C;
    // The grid's x covers the row: one item per thread, no stride (no 32-bit wrap).
    const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (j < row_len) {
      const int ow = j / cv, group = j - ow * cv;
      const int64_t w0 = static_cast<int64_t>(ow) * g.sw - g.pw;
      float m[N];
#pragma unroll
      for (int k = 0; k < N; ++k) m[k] = -std::numeric_limits<float>::infinity();
      const T* base = plane + static_cast<int64_t>(group) * N;
      for (int r = 0; r < g.kh; ++r) {
        const int64_t h = h0 + static_cast<int64_t>(r) * g.dh;
        if (h < 0 || h >= g.H) continue;
        for (int s = 0; s < g.kw; ++s) {
          const int64_t w = w0 + static_cast<int64_t>(s) * g.dw;
          if (w < 0 || w >= g.W) continue;
          const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(base + (h * g.W + w) * g.C);
#pragma unroll
          for (int k = 0; k < N; ++k) {
            const float f = static_cast<float>(v.v[k]);
            if (f > m[k] || isnan(f)) m[k] = f;
          }
        }
      }
      Pack<T, N> o;
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = static_cast<T>(m[k]);
      *reinterpret_cast<Pack<T, N>*>(out_row + static_cast<int64_t>(j) * N) = o;
    }
  }
}

}  // namespace

at::Tensor max_pool2d_nhwc(const at::Tensor& x, const PoolGeometry& p) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast),
              "max_pool2d_nhwc: x must be a (B, C, H, W) CUDA tensor contiguous in channels_last");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "max_pool2d_nhwc: x must be float32, float16 or bfloat16");
  Geometry g{};
  g.H = x.size(2), g.W = x.size(3), g.C = x.size(1);
  g.OH = max_pool2d_output_size(g.H, p.kernel_h, p.pad_h, p.stride_h, p.dilation_h, p.ceil_mode);
  g.OW = max_pool2d_output_size(g.W, p.kernel_w, p.pad_w, p.stride_w, p.dilation_w, p.ceil_mode);
  TORCH_CHECK(g.OH >= 1 && g.OW >= 1, "max_pool2d_nhwc: the input is smaller than one window");
  g.kh = static_cast<int>(p.kernel_h), g.kw = static_cast<int>(p.kernel_w);
  g.sh = static_cast<int>(p.stride_h), g.sw = static_cast<int>(p.stride_w);
  g.ph = static_cast<int>(p.pad_h), g.pw = static_cast<int>(p.pad_w);
  g.dh = static_cast<int>(p.dilation_h), g.dw = static_cast<int>(p.dilation_w);
  auto y = at::empty({x.size(0), g.C, g.OH, g.OW},
                     x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "max_pool2d_nhwc", [&] {
    constexpr int N = 16 / sizeof(scalar_t);
    const auto* px = x.data_ptr<scalar_t>();
    auto* py = y.data_ptr<scalar_t>();
    const bool vec = g.C % N == 0 && aligned16(px) && aligned16(py);
    const int64_t rows = x.size(0) * g.OH;
    const int64_t row_len = g.OW * g.C / (vec ? N : 1);
    TORCH_CHECK(row_len <= kMaxRowItems, "max_pool2d_nhwc: an output row of ", row_len,
                " items exceeds the kernel's 32-bit row index");
    const dim3 grid(static_cast<unsigned>((row_len + kThreads - 1) / kThreads),
                    static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    if (vec) {
      max_pool2d_nhwc_kernel<scalar_t, N><<<grid, kThreads, 0, stream>>>(px, py, rows, g);
    } else {
      max_pool2d_nhwc_kernel<scalar_t, 1><<<grid, kThreads, 0, stream>>>(px, py, rows, g);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

}  // namespace libreyolo::kernels::cuda
