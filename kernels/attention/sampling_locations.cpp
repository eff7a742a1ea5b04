#include "kernels/attention/sampling_locations.h"

#include <ATen/OpMathType.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace libreyolo::kernels {
namespace {

// The ATen expression: the reference for every device and dtype, and the path off the CPU.
// ref is (B, Q, 4).
at::Tensor sampling_locations_aten(const at::Tensor& offsets, const at::Tensor& ref,
                                   const PointScale& scale, double factor) {
  const auto box = ref.unsqueeze(2).unsqueeze(3);  // (B, Q, 1, 1, 4): views, no copy
  const auto xy = box.slice(-1, 0, 2), wh = box.slice(-1, 2, 4);
  const at::Tensor scaled =
      scale.per_point.defined() ? offsets * scale.per_point.unsqueeze(-1) : offsets / scale.divisor;
  return xy + scaled * wh * factor;
}

template <typename scalar_t>
void sampling_locations_cpu(const at::Tensor& offsets, const at::Tensor& ref,
                            const PointScale& scale, double factor, at::Tensor& out) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t BQ = offsets.size(0) * offsets.size(1), H = offsets.size(2), N = offsets.size(3);
  const scalar_t* o = offsets.const_data_ptr<scalar_t>();
  const scalar_t* r = ref.const_data_ptr<scalar_t>();
  const scalar_t* pp =
      scale.per_point.defined() ? scale.per_point.const_data_ptr<scalar_t>() : nullptr;
  scalar_t* y = out.mutable_data_ptr<scalar_t>();
  // ATen casts a Python-number operand to the op math type (a double to float for float32).
  const auto divisor = static_cast<opmath_t>(scale.divisor);
  const auto f = static_cast<opmath_t>(factor);
  // Queries split across the intra-op threads (a batch of 32 is 3.7 M values for RT-DETR).
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, H * N * 2));
  at::parallel_for(0, BQ, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bq = begin; bq < end; ++bq) {
      const scalar_t* box = r + bq * 4;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t n = 0; n < N; ++n) {
          const int64_t i = ((bq * H + h) * N + n) * 2;
          for (int64_t c = 0; c < 2; ++c) {
            // One rounding to scalar_t per ATen op, in upstream's order (the file is compiled
            // with -ffp-contract=off: a float32 multiply and add must not become one FMA).
            const auto s =
                pp ? scalar_t(static_cast<opmath_t>(o[i + c]) * static_cast<opmath_t>(pp[n]))
                   : scalar_t(static_cast<opmath_t>(o[i + c]) / divisor);
            const auto sw = scalar_t(static_cast<opmath_t>(s) * static_cast<opmath_t>(box[2 + c]));
            const auto swf = scalar_t(static_cast<opmath_t>(sw) * f);
            y[i + c] = scalar_t(static_cast<opmath_t>(box[c]) + static_cast<opmath_t>(swf));
          }
        }
      }
    }
  });
}

// (B, Q, 4): a view of either accepted form.
at::Tensor boxes_of(const at::Tensor& reference_boxes) {
  return reference_boxes.dim() == 4 ? reference_boxes.squeeze(2) : reference_boxes;
}

}  // namespace

at::Tensor sampling_locations(const SamplingLocationsHandle& handle, const at::Tensor& offsets,
                              const at::Tensor& reference_boxes, const PointScale& scale,
                              double factor) {
  TORCH_CHECK(offsets.defined() && offsets.dim() == 5 && offsets.size(4) == 2,
              "sampling_locations: offsets must be (B, Q, H, N, 2), got ",
              offsets.defined() ? c10::str(offsets.sizes()) : std::string("an undefined tensor"));
  TORCH_CHECK(reference_boxes.defined() &&
                  (reference_boxes.dim() == 3 ||
                   (reference_boxes.dim() == 4 && reference_boxes.size(2) == 1)) &&
                  reference_boxes.size(-1) == 4 && reference_boxes.size(0) == offsets.size(0) &&
                  reference_boxes.size(1) == offsets.size(1),
              "sampling_locations: reference_boxes must be (B, Q, 4) or (B, Q, 1, 4) with "
              "offsets' B and Q, got ",
              reference_boxes.defined() ? c10::str(reference_boxes.sizes()) : std::string("none"),
              " for offsets ", offsets.sizes());
  TORCH_CHECK(reference_boxes.scalar_type() == offsets.scalar_type(),
              "sampling_locations: reference_boxes must have the offsets' dtype ",
              offsets.scalar_type(), ", got ", reference_boxes.scalar_type());
  TORCH_CHECK(scale.per_point.defined() != (scale.divisor > 0.0),
              "sampling_locations: give either a divisor or per-point scales");
  TORCH_CHECK(!scale.per_point.defined() ||
                  (scale.per_point.dim() == 1 && scale.per_point.size(0) == offsets.size(3)),
              "sampling_locations: per_point must be (N) = (", offsets.size(3), "), got ",
              scale.per_point.sizes());
  const at::Tensor ref = boxes_of(reference_boxes);
  if (!handle.empty()) {
    if (auto out = handle(offsets, ref, scale.per_point, scale.divisor, factor))
      return std::move(*out);
  }
  return sampling_locations_portable(offsets, ref, scale, factor);
}

at::Tensor sampling_locations_portable(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                                       const PointScale& scale, double factor) {
  const at::Tensor ref = boxes_of(reference_boxes);
  if (!sampling_locations_fused(offsets, ref, scale))
    return sampling_locations_aten(offsets, ref, scale, factor);
  const at::Tensor o = offsets.contiguous(), r = ref.contiguous();  // rows of 4 values
  PointScale s = scale;
  if (s.per_point.defined()) s.per_point = s.per_point.contiguous();
  at::Tensor out = at::empty_like(o);
  switch (o.scalar_type()) {  // the fused dtypes
    case at::kFloat:
      sampling_locations_cpu<float>(o, r, s, factor, out);
      break;
    case at::kBFloat16:
      sampling_locations_cpu<at::BFloat16>(o, r, s, factor, out);
      break;
    default:
      sampling_locations_cpu<at::Half>(o, r, s, factor, out);
      break;
  }
  return out;
}

bool sampling_locations_fused(const at::Tensor& offsets, const at::Tensor& reference_boxes,
                              const PointScale& scale) {
  const auto dtype = offsets.scalar_type();
  const bool grad =
      at::GradMode::is_enabled() && (offsets.requires_grad() || reference_boxes.requires_grad());
  return !grad && offsets.is_cpu() && reference_boxes.is_cpu() &&
         reference_boxes.scalar_type() == dtype &&
         (!scale.per_point.defined() ||
          (scale.per_point.is_cpu() && scale.per_point.scalar_type() == dtype)) &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
}

}  // namespace libreyolo::kernels
