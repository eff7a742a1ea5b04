// CUDA kernel of the `cuda` image_preprocess (see image_preprocess_cuda.h). Each thread makes one
// output pixel of one image in all three channels: the antialiased bilinear resize of the uint8
// pixels, torchvision's round back to uint8, the rescale / normalise, the cast to the output
// dtype; pixels outside the image's resized size are the padding (0). The resize repeats ATen's
// CUDA kernel operation for operation (aten/src/ATen/native/cuda/UpSampleBilinear2d.cu
// upsample_gen2d_aa_out_frame with UpSample.cuh upsample_antialias::_compute_weights_span,
// _compute_weights and interpolate_aa_single_dim, PyTorch 2.11): the same float32 expressions
// in the same order and with the same fused multiply-adds as its compiled code (rows first, then
// columns; products summed left to right as FMAs; weights_span below), so that the rounded uint8
// values agree with the portable path's; uint8 pixels are read directly instead of a float32 copy
// of the image (the values are the same). RfDetrImageProcessor's order (rescale_before_resize)
// is the kernel's kRescaleFirst instance: each pixel times rescale_factor as ATen's separate
// multiply rounds it, the same resize over those values, no uint8 rounding, then
// (x - mean) / std.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "kernels/image/cuda/image_preprocess_cuda.h"

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kBlockX = 32;  // ATen's block_x (a warp along the row)
constexpr int kBlockY = 8;

/// One image of a launch.
struct ImageParams {
  const uint8_t* src;  // (3, in_h, in_w) contiguous
  int in_h, in_w;
  int out_h, out_w;        // the resized size inside the output row
  float scale_h, scale_w;  // resize_scale
};

struct LaunchImages {
  ImageParams image[kMaxImagesPerLaunch];
};

/// The output and the value step.
template <typename T>
struct Output {
  T* data;
  int64_t stride_n, stride_c, stride_h, stride_w;  // elements
  int height, width;                               // H, W of `out`
  int first;                                       // out's row of image[0]
  int values;                                      // ImagePreprocessSpec::Values
  float rescale_factor;
  float mean[3], std[3];  // mean_scaled / std_scaled, or mean / std with kRescaleFirst
};

// UpSample.cuh BilinearFilterFunctor.
__device__ __forceinline__ float bilinear_filter(float x) {
  if (x < 0) x = -x;
  if (x < 1) return 1 - x;
  return 0;
}

// UpSample.cuh _compute_weights_span, with its float32 operations as ATen's compiled kernel
// performs them: in the sm_90 code of the torch 2.11 wheel (nvdisasm of libtorch_cuda.so's
// upsample_gen2d_aa_out_frame<float, float, BilinearFilterFunctor>) each product
// scale * (i + 0.5) is fused into the add or subtract that uses it (FFMA), while nvcc left this
// kernel's written-out expression as a rounded product then an add. The rounded centre moved the
// weights by an ulp, enough to flip uint8 values that land on .5 (0.26% of RT-DETR's 640x640
// upscale), so the fused operations are spelled out. `xmin_m_center` is xmin - center.
__device__ __forceinline__ void weights_span(int i, int input_size, float scale, float support,
                                             int& xmin, int& xsize, float& xmin_m_center) {
  const float pos = static_cast<float>(i) + 0.5f;
  xmin = max(static_cast<int>(__fadd_rn(__fmaf_rn(pos, scale, -support), 0.5f)), 0);
  xsize = min(static_cast<int>(__fadd_rn(__fmaf_rn(pos, scale, support), 0.5f)), input_size) - xmin;
  xmin_m_center = __fmaf_rn(-pos, scale, static_cast<float>(xmin));
}

// UpSample.cuh _compute_weights (invscale as there: 1.0 / scale in double, stored as float).
__device__ __forceinline__ void compute_weights(float* w, float scale, float xmin_m_center,
                                                int xsize) {
  const float invscale = (scale >= 1.0) ? 1.0 / scale : 1.0;
  float total_w = 0.0f;
  for (int j = 0; j < xsize; j++) {
    const float v = bilinear_filter((j + xmin_m_center + 0.5f) * invscale);
    w[j] = v;
    total_w += v;
  }
  for (int j = 0; j < xsize; j++) {
    if (total_w != 0.0) w[j] /= total_w;
  }
}

/// The value of one input pixel: the uint8 level, or with kRescaleFirst the rounded float32
/// product with rescale_factor (ATen's `x * rescale_factor` before the resize, its own kernel).
template <bool kRescaleFirst>
__device__ __forceinline__ float input_value(uint8_t p, float rescale_factor) {
  if constexpr (kRescaleFirst) return __fmul_rn(static_cast<float>(p), rescale_factor);
  return static_cast<float>(p);
}

template <typename T, bool kRescaleFirst>
__global__ void __launch_bounds__(kBlockX* kBlockY)
    preprocess_kernel(const __grid_constant__ LaunchImages images, const Output<T> o, int taps_w,
                      int taps_h) {
  extern __shared__ float smem[];
  float* wx = smem + taps_w * threadIdx.x;
  float* wy = smem + taps_w * kBlockX + taps_h * threadIdx.y;
  // __grid_constant__: read in the parameter space, not copied per thread for the dynamic index.
  const ImageParams& im = images.image[blockIdx.z];
  const int x = blockIdx.x * kBlockX + threadIdx.x;
  const int y = blockIdx.y * kBlockY + threadIdx.y;
  const bool inside = x < im.out_w && y < im.out_h;
  // support = (filter size 2 * 0.5) * scale for a downscale, else 1 (as ATen's kernel).
  const float support_w = im.scale_w >= 1.0 ? (2 * 0.5f) * im.scale_w : 2 * 0.5f;
  const float support_h = im.scale_h >= 1.0 ? (2 * 0.5f) * im.scale_h : 2 * 0.5f;
  int xmin = 0, xsize = 0, ymin = 0, ysize = 0;
  float xmin_m_xcenter = 0, ymin_m_ycenter = 0;
  if (inside) {
    weights_span(x, im.in_w, im.scale_w, support_w, xmin, xsize, xmin_m_xcenter);
    weights_span(y, im.in_h, im.scale_h, support_h, ymin, ysize, ymin_m_ycenter);
    // Row 0 of the block computes its columns' weights, column 0 its rows' (ATen's split).
    if (threadIdx.y == 0) compute_weights(wx, im.scale_w, xmin_m_xcenter, xsize);
    if (threadIdx.x == 0) compute_weights(wy, im.scale_h, ymin_m_ycenter, ysize);
  }
  __syncthreads();
  if (x >= o.width || y >= o.height) return;
  T* dst = o.data + (o.first + blockIdx.z) * o.stride_n + y * o.stride_h + x * o.stride_w;
  if (!inside) {  // the padding
    for (int c = 0; c < 3; ++c) dst[c * o.stride_c] = static_cast<T>(0.0f);
    return;
  }
  const int64_t plane = static_cast<int64_t>(im.in_h) * im.in_w;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const uint8_t* src = im.src + c * plane + static_cast<int64_t>(ymin) * im.in_w + xmin;
    float output = 0.0f;
    for (int r = 0; r < ysize; ++r, src += im.in_w) {
      // interpolate_aa_single_dim along the row: the value ATen keeps in its shared buffer.
      float row = input_value<kRescaleFirst>(src[0], o.rescale_factor) * wx[0];
      for (int j = 1; j < xsize; ++j)
        row += input_value<kRescaleFirst>(src[j], o.rescale_factor) * wx[j];
      // ... and along the column, over those values.
      if (r == 0)
        output = row * wy[0];
      else
        output += row * wy[r];
    }
    if constexpr (kRescaleFirst) {
      // rescale_resize_normalize: the float32 resize as it is, then tvF.normalize's
      // x.sub_(mean).div_(std).
      float v = output;
      if (o.values == static_cast<int>(ImagePreprocessSpec::Values::normalize))
        v = __fdiv_rn(__fsub_rn(v, o.mean[c]), o.std[c]);
      dst[c * o.stride_c] = static_cast<T>(v);
      continue;
    }
    // torchvision's float -> uint8 (round half to even; the weights are non-negative and sum to
    // 1, so no clamp), then the float32 value of that uint8.
    const float u8 = rintf(output);
    float v = u8;
    if (o.values == static_cast<int>(ImagePreprocessSpec::Values::normalize))
      v = __fdiv_rn(__fsub_rn(u8, o.mean[c]), o.std[c]);  // x.sub_(mean).div_(std)
    else if (o.values == static_cast<int>(ImagePreprocessSpec::Values::rescale))
      v = __fmul_rn(u8, o.rescale_factor);    // x.mul_(rescale_factor)
    dst[c * o.stride_c] = static_cast<T>(v);  // .to(dtype): round to nearest even
  }
}

template <typename T>
void launch_all(const std::vector<at::Tensor>& images, const ImagePreprocessSpec& spec,
                const at::Tensor& out, cudaStream_t stream) {
  Output<T> o{};
  o.data = out.data_ptr<T>();
  o.stride_n = out.stride(0);
  o.stride_c = out.stride(1);
  o.stride_h = out.stride(2);
  o.stride_w = out.stride(3);
  o.height = static_cast<int>(out.size(2));
  o.width = static_cast<int>(out.size(3));
  o.values = static_cast<int>(spec.values);
  o.rescale_factor = spec.rescale_factor;
  for (int c = 0; c < 3; ++c) {
    o.mean[c] = spec.rescale_before_resize ? spec.mean[c] : spec.mean_scaled[c];
    o.std[c] = spec.rescale_before_resize ? spec.std[c] : spec.std_scaled[c];
  }
  const int b = static_cast<int>(images.size());
  for (int first = 0; first < b; first += kMaxImagesPerLaunch) {
    const int n = std::min(kMaxImagesPerLaunch, b - first);
    LaunchImages li{};
    int taps_w = 1, taps_h = 1;
    for (int k = 0; k < n; ++k) {
      const at::Tensor& im = images[first + k];
      const auto [oh, ow] = spec.sizes[first + k];
      ImageParams& p = li.image[k];
      p.src = im.data_ptr<uint8_t>();
      p.in_h = static_cast<int>(im.size(1));
      p.in_w = static_cast<int>(im.size(2));
      p.out_h = static_cast<int>(oh);
      p.out_w = static_cast<int>(ow);
      p.scale_h = resize_scale(p.in_h, p.out_h);
      p.scale_w = resize_scale(p.in_w, p.out_w);
      taps_w = std::max(taps_w, resize_taps(p.in_w, p.out_w));
      taps_h = std::max(taps_h, resize_taps(p.in_h, p.out_h));
    }
    o.first = first;
    const dim3 block(kBlockX, kBlockY);
    const dim3 grid((o.width + kBlockX - 1) / kBlockX, (o.height + kBlockY - 1) / kBlockY, n);
    const size_t shared = sizeof(float) * (static_cast<size_t>(taps_w) * kBlockX +
                                           static_cast<size_t>(taps_h) * kBlockY);
    if (spec.rescale_before_resize)
      preprocess_kernel<T, true><<<grid, block, shared, stream>>>(li, o, taps_w, taps_h);
    else
      preprocess_kernel<T, false><<<grid, block, shared, stream>>>(li, o, taps_w, taps_h);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

void image_preprocess(const std::vector<at::Tensor>& images, const ImagePreprocessSpec& spec,
                      const at::Tensor& out) {
  const char* why = image_preprocess_decline_reason(images, spec, out);
  TORCH_CHECK(why == nullptr, "image_preprocess (cuda): ", why ? why : "");
  TORCH_CHECK(spec.sizes.size() == images.size() &&
                  out.size(0) == static_cast<int64_t>(images.size()) && out.size(1) == 3,
              "image_preprocess (cuda): ", images.size(), " images, ", spec.sizes.size(),
              " sizes, output ", out.sizes());
  for (std::size_t i = 0; i < images.size(); ++i) {
    const auto [h, w] = spec.sizes[i];
    TORCH_CHECK(h >= 1 && w >= 1 && h <= out.size(2) && w <= out.size(3),
                "image_preprocess (cuda): image ", i, " resizes to ", h, "x", w,
                ", outside the output's ", out.size(2), "x", out.size(3));
  }
  if (images.empty()) return;
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (out.scalar_type()) {
    case at::kFloat:
      launch_all<float>(images, spec, out, stream);
      break;
    case at::kHalf:
      launch_all<c10::Half>(images, spec, out, stream);
      break;
    default:
      launch_all<c10::BFloat16>(images, spec, out, stream);
  }
}

}  // namespace libreyolo::kernels::cuda
