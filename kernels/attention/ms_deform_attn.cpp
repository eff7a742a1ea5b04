// Multi-scale deformable attention: the slot entry point and the portable grid_sample path.
//
// The portable math follows fundamentalvision/Deformable-DETR
// models/ops/functions/ms_deform_attn_func.py (ms_deform_attn_core_pytorch) operation for
// operation, so that its float32 result matches PyTorch's reference bit for bit on the same
// device. The RT-DETRv2 flat-points variant follows transformers
// models/rt_detr_v2/modeling_rt_detr_v2.py (multi_scale_deformable_attention_v2) and
// lyuwenyu/RT-DETR rtdetrv2_pytorch (deformable_attention_core_func_v2).
#include "kernels/attention/ms_deform_attn.h"

#include <ATen/Dispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <utility>

namespace libreyolo::kernels {
namespace {

// at::grid_sampler's integer enums (aten/src/ATen/native/GridSamplerUtils.h).
constexpr int64_t kInterpolationBilinear = 0;
constexpr int64_t kPaddingZeros = 0;

/// at::grid_sampler(value, grid) with bilinear interpolation, zero padding and
/// align_corners=False: value (N, C, H_in, W_in), grid (N, H_out, W_out, 2) in value's dtype;
/// returns (N, C, H_out, W_out) in value's dtype. On the CPU, float16 and bfloat16 sample in
/// float32 (the result rounded back once): LibTorch 2.11's vectorized 16-bit CPU kernel
/// (aten/src/ATen/native/cpu/GridSamplerKernel.cpp through at::vec mask_gather<2>) gathers wrong
/// pixels (1.16 off on unit-normal values) and reads outside the input, which crashed a bfloat16
/// RT-DETR served on the CPU (OpsMsDeformAttn.SixteenBitCpuSamplesLikeFloat32).
at::Tensor grid_sample_bilinear(const at::Tensor& value, const at::Tensor& grid) {
  const auto dtype = value.scalar_type();
  if (value.is_cpu() && (dtype == at::kHalf || dtype == at::kBFloat16)) {
    return at::grid_sampler(value.to(at::kFloat), grid.to(at::kFloat), kInterpolationBilinear,
                            kPaddingZeros, false)
        .to(dtype);
  }
  return at::grid_sampler(value, grid, kInterpolationBilinear, kPaddingZeros, false);
}

/// Number of pixels of every level, checking that each size is positive.
std::vector<int64_t> level_sizes(const SpatialShapes& shapes) {
  TORCH_CHECK(!shapes.empty(), "ms_deform_attn: spatial_shapes is empty (expected L >= 1 levels)");
  std::vector<int64_t> sizes;
  sizes.reserve(shapes.size());
  for (size_t l = 0; l < shapes.size(); ++l) {
    TORCH_CHECK(shapes[l][0] > 0 && shapes[l][1] > 0, "ms_deform_attn: spatial_shapes[", l, "] = (",
                shapes[l][0], ", ", shapes[l][1], ") must be positive (H, W)");
    sizes.push_back(shapes[l][0] * shapes[l][1]);
  }
  return sizes;
}

/// True for the floating dtypes the portable path computes in.
bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

/// Checks `value` (B, S, H, C) against `shapes` (S = sum H_l * W_l) and returns S's split sizes.
std::vector<int64_t> check_value(const at::Tensor& value, const SpatialShapes& shapes) {
  TORCH_CHECK(value.defined(), "ms_deform_attn: value is undefined");
  TORCH_CHECK(value.dim() == 4, "ms_deform_attn: value must be (B, S, H, C), got ", value.sizes());
  TORCH_CHECK(is_supported_float(value.scalar_type()),
              "ms_deform_attn: value must be float32, float16, bfloat16 or float64, got ",
              value.scalar_type());
  auto sizes = level_sizes(shapes);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  TORCH_CHECK(value.size(1) == total, "ms_deform_attn: value.size(1) = ", value.size(1),
              " but spatial_shapes give S = sum(H_l * W_l) = ", total);
  return sizes;
}

/// Checks a location/weight tensor's dtype and device against `value`.
void check_companion(const char* name, const at::Tensor& t, const at::Tensor& value) {
  TORCH_CHECK(t.defined(), "ms_deform_attn: ", name, " is undefined");
  TORCH_CHECK(is_supported_float(t.scalar_type()), "ms_deform_attn: ", name,
              " must be a floating tensor, got ", t.scalar_type());
  TORCH_CHECK(t.device() == value.device(), "ms_deform_attn: ", name, " is on ", t.device(),
              " but value is on ", value.device());
}

/// Validates the classic layout (see ms_deform_attn.h); throws c10::Error naming the tensor.
void check_classic(const at::Tensor& value, const SpatialShapes& shapes, const at::Tensor& locs,
                   const at::Tensor& weights) {
  check_value(value, shapes);
  check_companion("sampling_locations", locs, value);
  check_companion("attention_weights", weights, value);
  const int64_t B = value.size(0), H = value.size(2);
  const int64_t L = static_cast<int64_t>(shapes.size());
  TORCH_CHECK(locs.dim() == 6 && locs.size(0) == B && locs.size(2) == H && locs.size(3) == L &&
                  locs.size(5) == 2,
              "ms_deform_attn: sampling_locations must be (B, Q, H, L, P, 2) = (", B, ", Q, ", H,
              ", ", L, ", P, 2), got ", locs.sizes());
  TORCH_CHECK(weights.dim() == 5 && weights.sizes() == locs.sizes().slice(0, 5),
              "ms_deform_attn: attention_weights must be (B, Q, H, L, P) = ",
              locs.sizes().slice(0, 5), ", got ", weights.sizes());
}

/// Validates the RT-DETRv2 flat-points layout (see ms_deform_attn_v2 in ms_deform_attn.h).
void check_flat(const at::Tensor& value, const SpatialShapes& shapes, const at::Tensor& locs,
                const at::Tensor& weights, const std::vector<int64_t>& num_points) {
  check_value(value, shapes);
  check_companion("sampling_locations", locs, value);
  check_companion("attention_weights", weights, value);
  TORCH_CHECK(num_points.size() == shapes.size(), "ms_deform_attn_v2: num_points has ",
              num_points.size(), " entries but spatial_shapes has ", shapes.size(), " levels");
  int64_t sum_points = 0;
  for (size_t l = 0; l < num_points.size(); ++l) {
    TORCH_CHECK(num_points[l] > 0, "ms_deform_attn_v2: num_points[", l, "] = ", num_points[l],
                " must be positive");
    sum_points += num_points[l];
  }
  const int64_t B = value.size(0), H = value.size(2);
  TORCH_CHECK(locs.dim() == 5 && locs.size(0) == B && locs.size(2) == H &&
                  locs.size(3) == sum_points && locs.size(4) == 2,
              "ms_deform_attn_v2: sampling_locations must be (B, Q, H, sum(P_l), 2) = (", B,
              ", Q, ", H, ", ", sum_points, ", 2), got ", locs.sizes());
  TORCH_CHECK(weights.dim() == 4 && weights.sizes() == locs.sizes().slice(0, 4),
              "ms_deform_attn_v2: attention_weights must be (B, Q, H, sum(P_l)) = ",
              locs.sizes().slice(0, 4), ", got ", weights.sizes());
}

/// Small process-wide cache of the per-(shapes, device) int64 tensors, so that repeated calls
/// (every decoder layer, every request) neither allocate nor copy host-to-device again, which
/// also keeps a CUDA-graph capture after a warm-up free of copies. Leaked on purpose: cached
/// CUDA tensors must not be freed during static destruction.
class ShapeTensorCache {
 public:
  /// The cached tensor for (`kind`, `shapes`, `device`), built by `make` on a miss.
  template <class Make>
  at::Tensor get(int kind, const SpatialShapes& shapes, const at::Device& device, Make&& make) {
    Key key{kind, shapes, device.type(), device.index()};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    at::Tensor t = make();
    std::lock_guard<std::mutex> lock(mutex_);
    if (map_.size() >= kCapacity) map_.clear();  // shapes are few per model; no LRU needed
    return map_.emplace(std::move(key), std::move(t)).first->second;
  }

  /// The process cache.
  static ShapeTensorCache& instance() {
    static auto* cache = new ShapeTensorCache();
    return *cache;
  }

 private:
  using Key = std::tuple<int, SpatialShapes, c10::DeviceType, c10::DeviceIndex>;
  static constexpr size_t kCapacity = 64;
  std::mutex mutex_;
  std::map<Key, at::Tensor> map_;
};

/// Output channel layout shared by both cores: (B*H, C, Q) -> (B, Q, H*C), h-major channels.
at::Tensor to_output(const at::Tensor& summed, int64_t B, int64_t H, int64_t C, int64_t Q) {
  return summed.view({B, H * C, Q}).transpose(1, 2).contiguous();
}

/// Reads value at integer (x, y) pixel coordinates: value_l (BH, C, H_l*W_l), x/y (BH, Q, P)
/// int64 already clamped into the map. Returns (BH, C, Q, P).
at::Tensor gather_pixels(const at::Tensor& value_l, const at::Tensor& x, const at::Tensor& y,
                         int64_t width) {
  const int64_t BH = value_l.size(0), C = value_l.size(1);
  const int64_t Q = x.size(1), P = x.size(2);
  auto index = (y * width + x).reshape({BH, 1, Q * P}).expand({BH, C, Q * P});
  return at::gather(value_l, 2, index).view({BH, C, Q, P});
}

/// The points of each level padded to P with `fill`: t (B, Q, H, sum P_l) or (B, Q, H, sum P_l, 2)
/// -> (B, Q, H, L, P) or (B, Q, H, L, P, 2) in t's dtype. On the CPU without autograd one pass of
/// copies and fills (the constant_pad_nd per level and the stack cost D-FINE L about 0.3 ms per
/// forward at batch 1); otherwise those ATen ops, which keep the gradient history.
at::Tensor pad_levels(const at::Tensor& t, const std::vector<int64_t>& num_points, int64_t P,
                      double fill) {
  TORCH_INTERNAL_ASSERT(t.dim() == 4 || t.dim() == 5, "pad_levels: t must be 4-D or 5-D");
  const int64_t inner = t.dim() == 5 ? t.size(4) : 1;
  const int64_t L = static_cast<int64_t>(num_points.size()), S = t.size(3);
  std::vector<int64_t> out_shape{t.size(0), t.size(1), t.size(2), L, P};
  if (t.dim() == 5) out_shape.push_back(inner);
  if (!t.is_cpu() || (at::GradMode::is_enabled() && t.requires_grad())) {
    std::vector<at::Tensor> levels;
    int64_t start = 0;
    for (const int64_t p : num_points) {
      std::vector<int64_t> pad{0, P - p};
      if (t.dim() == 5) pad.insert(pad.begin(), {0, 0});
      levels.push_back(at::constant_pad_nd(t.narrow(3, start, p), pad, fill));
      start += p;
    }
    return at::stack(levels, 3);
  }
  const at::Tensor src = t.contiguous();
  at::Tensor out = at::empty(out_shape, t.options());
  const int64_t rows = t.size(0) * t.size(1) * t.size(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "pad_levels", [&] {
    const scalar_t* in = src.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const auto value = static_cast<scalar_t>(fill);
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* row_in = in + r * S * inner;
      scalar_t* row_out = o + r * L * P * inner;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t p = num_points[l];
        row_out = std::copy_n(row_in, p * inner, row_out);
        row_out = std::fill_n(row_out, (P - p) * inner, value);
        row_in += p * inner;
      }
    }
  });
  return out;
}

}  // namespace

at::Tensor spatial_shapes_tensor(const SpatialShapes& shapes, const at::Device& device) {
  level_sizes(shapes);  // validates
  return ShapeTensorCache::instance().get(0, shapes, device, [&] {
    auto t = at::empty({static_cast<int64_t>(shapes.size()), 2}, at::kLong);
    auto a = t.accessor<int64_t, 2>();
    for (size_t l = 0; l < shapes.size(); ++l) {
      a[l][0] = shapes[l][0];
      a[l][1] = shapes[l][1];
    }
    return t.to(device);
  });
}

at::Tensor level_start_index(const SpatialShapes& shapes, const at::Device& device) {
  const auto sizes = level_sizes(shapes);
  return ShapeTensorCache::instance().get(1, shapes, device, [&] {
    auto t = at::empty({static_cast<int64_t>(sizes.size())}, at::kLong);
    auto a = t.accessor<int64_t, 1>();
    int64_t start = 0;
    for (size_t l = 0; l < sizes.size(); ++l) {
      a[l] = start;
      start += sizes[l];
    }
    return t.to(device);
  });
}

at::Tensor ms_deform_attn_portable(const at::Tensor& value, const SpatialShapes& shapes,
                                   const at::Tensor& sampling_locations,
                                   const at::Tensor& attention_weights) {
  check_classic(value, shapes, sampling_locations, attention_weights);
  const int64_t B = value.size(0), H = value.size(2), C = value.size(3);
  const int64_t Q = sampling_locations.size(1);
  const int64_t L = sampling_locations.size(3), P = sampling_locations.size(4);
  // grid_sample needs input and grid of one dtype: locations and weights follow value's dtype
  // (what MMCV's .type_as(value) does), so half values compute in half end to end.
  const auto locs = sampling_locations.to(value.scalar_type());
  const auto weights = attention_weights.to(value.scalar_type());

  const auto value_list = value.split_with_sizes(level_sizes(shapes), 1);
  const auto grids = 2 * locs - 1;  // align_corners=False: pixel = loc * size - 0.5
  std::vector<at::Tensor> sampled;
  sampled.reserve(L);
  for (int64_t l = 0; l < L; ++l) {
    // (B, HW, H, C) -> (B, HW, H*C) -> (B, H*C, HW) -> (B*H, C, H_l, W_l)
    auto value_l =
        value_list[l].flatten(2).transpose(1, 2).reshape({B * H, C, shapes[l][0], shapes[l][1]});
    // (B, Q, H, P, 2) -> (B, H, Q, P, 2) -> (B*H, Q, P, 2)
    auto grid_l = grids.select(3, l).transpose(1, 2).flatten(0, 1);
    // (B*H, C, Q, P)
    sampled.push_back(grid_sample_bilinear(value_l, grid_l));
  }
  // (B, Q, H, L, P) -> (B, H, Q, L, P) -> (B*H, 1, Q, L*P)
  auto w = weights.transpose(1, 2).reshape({B * H, 1, Q, L * P});
  auto summed = (at::stack(sampled, -2).flatten(-2) * w).sum(-1);
  return to_output(summed, B, H, C, Q);
}

at::Tensor ms_deform_attn(const MsDeformAttnHandle& handle, const at::Tensor& value,
                          const SpatialShapes& shapes, const at::Tensor& sampling_locations,
                          const at::Tensor& attention_weights) {
  // Validate before any implementation sees the input: a malformed input must be the caller's
  // error, not a "runtime failure" that would disable an implementation for the process.
  check_classic(value, shapes, sampling_locations, attention_weights);
  if (handle.empty()) {
    return ms_deform_attn_portable(value, shapes, sampling_locations, attention_weights);
  }
  const auto shapes_t = spatial_shapes_tensor(shapes, value.device());
  const auto start_t = level_start_index(shapes, value.device());
  auto out = handle(value, shapes_t, start_t, sampling_locations, attention_weights);
  if (!out) return ms_deform_attn_portable(value, shapes, sampling_locations, attention_weights);
  const int64_t B = value.size(0), Q = sampling_locations.size(1);
  const int64_t HC = value.size(2) * value.size(3);
  TORCH_CHECK(out->defined() && out->dim() == 3 && out->size(0) == B && out->size(1) == Q &&
                  out->size(2) == HC,
              "ms_deform_attn: an implementation of the slot returned ",
              out->defined() ? c10::str(out->sizes()) : std::string("an undefined tensor"),
              ", expected (B, Q, H*C) = (", B, ", ", Q, ", ", HC, ")");
  return std::move(*out);
}

at::Tensor ms_deform_attn_v2(const MsDeformAttnHandle& handle, const at::Tensor& value,
                             const SpatialShapes& shapes, const at::Tensor& sampling_locations,
                             const at::Tensor& attention_weights,
                             const std::vector<int64_t>& num_points, SamplingMethod method) {
  check_flat(value, shapes, sampling_locations, attention_weights, num_points);
  const int64_t B = value.size(0), H = value.size(2), C = value.size(3);
  const int64_t Q = sampling_locations.size(1), L = static_cast<int64_t>(shapes.size());
  const bool equal_points = std::all_of(num_points.begin(), num_points.end(),
                                        [&](int64_t p) { return p == num_points[0]; });
  if (method == SamplingMethod::bilinear && equal_points) {
    const int64_t P = num_points[0];
    return ms_deform_attn(handle, value, shapes, sampling_locations.reshape({B, Q, H, L, P, 2}),
                          attention_weights.reshape({B, Q, H, L, P}));
  }
  if (method == SamplingMethod::bilinear && (value.is_cuda() || !handle.empty())) {
    // Ragged points per level (D-FINE [3, 6, 3]) on CUDA, or on the CPU with an implementation
    // bound: pad every level to the most points with weight 0, so the padded samples add exact
    // zeros, and take the classic layout the slot's kernels serve (18 samples instead of 12 for
    // [3, 6, 3], in one call instead of a grid_sample per level). The CPU without one keeps
    // transformers' per-level split below.
    const int64_t P = *std::max_element(num_points.begin(), num_points.end());
    return ms_deform_attn(handle, value, shapes, pad_levels(sampling_locations, num_points, P, 0.5),
                          pad_levels(attention_weights, num_points, P, 0.0));
  }

  const bool discrete = method != SamplingMethod::bilinear;
  // Bilinear: grid_sample needs locations in value's dtype. Discrete: upstream computes the
  // integer coordinates in the locations' own dtype.
  const auto locs = discrete ? sampling_locations : sampling_locations.to(value.scalar_type());
  const auto weights = attention_weights.to(value.scalar_type());
  // (B, S, H, C) -> (B, H, C, S) -> (B*H, C, S), split per level.
  const auto value_list =
      value.permute({0, 2, 3, 1}).flatten(0, 1).split_with_sizes(level_sizes(shapes), -1);
  // (B, Q, H, sumP, 2) -> (B, H, Q, sumP, 2) -> (B*H, Q, sumP, 2), split per level.
  const auto grids = (discrete ? locs : 2 * locs - 1)
                         .permute({0, 2, 1, 3, 4})
                         .flatten(0, 1)
                         .split_with_sizes(num_points, -2);
  std::vector<at::Tensor> sampled;
  sampled.reserve(L);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t height = shapes[l][0], width = shapes[l][1];
    if (!discrete) {
      auto value_l = value_list[l].reshape({B * H, C, height, width});
      sampled.push_back(grid_sample_bilinear(value_l, grids[l]));
      continue;
    }
    // coord = int64(loc * (W, H) + 0.5): the cast truncates toward zero, as torch's .to(int64).
    auto x = (grids[l].select(-1, 0) * static_cast<double>(width) + 0.5).to(at::kLong);
    auto y = (grids[l].select(-1, 1) * static_cast<double>(height) + 0.5).to(at::kLong);
    // lyuwenyu/RT-DETR clamps x by H - 1 too ("FIX ME? for rectangle input"); transformers
    // clamps each axis by its own size.
    const int64_t x_max = method == SamplingMethod::discrete ? height - 1 : width - 1;
    x = x.clamp(0, std::min(x_max, width - 1));
    y = y.clamp(0, height - 1);
    sampled.push_back(gather_pixels(value_list[l].contiguous(), x, y, width));
  }
  const int64_t sum_points = sampling_locations.size(3);
  // (B, Q, H, sumP) -> (B, H, Q, sumP) -> (B*H, 1, Q, sumP)
  auto w = weights.permute({0, 2, 1, 3}).reshape({B * H, 1, Q, sum_points});
  auto summed = (at::cat(sampled, -1) * w).sum(-1);
  return to_output(summed, B, H, C, Q);
}

}  // namespace libreyolo::kernels
