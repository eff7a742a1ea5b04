#include "models/deformable_detr/geometry.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace libreyolo::models::deformable_detr {
namespace {

constexpr double kTwoPi = 2 * M_PI;

/// temperature ** (2 * floor(i / 2) / n) for i in [0, n), in `dtype`.
at::Tensor dim_t(int64_t n, at::ScalarType dtype, const at::Device& device,
                 double temperature = 10000) {
  auto d = at::arange(n, at::TensorOptions().dtype(at::kLong).device(device)).to(dtype);
  return at::pow(temperature, 2 * at::div(d, 2, "floor") / n);
}

/// stack(sin(x[..., 0::2]), cos(x[..., 1::2]), dim=-1).flatten(-2) on the last dimension.
at::Tensor interleave_sin_cos(const at::Tensor& x) {
  const int64_t last = x.dim() - 1;
  return at::stack(
             {x.slice(last, 0, c10::nullopt, 2).sin(), x.slice(last, 1, c10::nullopt, 2).cos()},
             x.dim())
      .flatten(last);
}

}  // namespace

at::Tensor sine_position_embedding(const at::Tensor& mask, int64_t num_features,
                                   at::ScalarType dtype, double offset, double temperature) {
  const auto m = mask.to(dtype);
  auto y = m.cumsum(1);
  auto x = m.cumsum(2);
  const double eps = 1e-6;
  if (offset != 0) {
    y = (y - offset) / (y.slice(1, -1) + eps) * kTwoPi;
    x = (x - offset) / (x.slice(2, -1) + eps) * kTwoPi;
  } else {
    y = y / (y.slice(1, -1) + eps) * kTwoPi;
    x = x / (x.slice(2, -1) + eps) * kTwoPi;
  }
  const auto d = dim_t(num_features, dtype, mask.device(), temperature);
  const auto pos_x = interleave_sin_cos(x.unsqueeze(-1) / d);
  const auto pos_y = interleave_sin_cos(y.unsqueeze(-1) / d);
  return at::cat({pos_y, pos_x}, 3).permute({0, 3, 1, 2});
}

at::Tensor valid_ratio(const at::Tensor& mask, at::ScalarType dtype) {
  const int64_t h = mask.size(1), w = mask.size(2);
  const auto valid_h = mask.select(2, 0).sum(1);
  const auto valid_w = mask.select(1, 0).sum(1);
  return at::stack({valid_w.to(dtype) / w, valid_h.to(dtype) / h}, -1);
}

at::Tensor encoder_reference_points(const kernels::SpatialShapes& shapes,
                                    const at::Tensor& valid_ratios) {
  const auto opts = valid_ratios.options();
  std::vector<at::Tensor> refs;
  for (size_t l = 0; l < shapes.size(); ++l) {
    const int64_t h = shapes[l][0], w = shapes[l][1];
    const auto grids = at::meshgrid(
        {at::linspace(0.5, h - 0.5, h, opts), at::linspace(0.5, w - 0.5, w, opts)}, "ij");
    const auto lvl = static_cast<int64_t>(l);
    const auto ref_y = grids[0].reshape({-1}).unsqueeze(0) /
                       (valid_ratios.select(1, lvl).select(1, 1).unsqueeze(1) * h);
    const auto ref_x = grids[1].reshape({-1}).unsqueeze(0) /
                       (valid_ratios.select(1, lvl).select(1, 0).unsqueeze(1) * w);
    refs.push_back(at::stack({ref_x, ref_y}, -1));
  }
  const auto ref = at::cat(refs, 1);
  return ref.unsqueeze(2) * valid_ratios.unsqueeze(1);
}

std::pair<at::Tensor, at::Tensor> encoder_output_proposals(const at::Tensor& memory,
                                                           const at::Tensor& padding_mask,
                                                           const kernels::SpatialShapes& shapes) {
  const int64_t B = memory.size(0);
  const auto opts = memory.options();
  std::vector<at::Tensor> proposals;
  int64_t cur = 0;
  for (size_t l = 0; l < shapes.size(); ++l) {
    const int64_t h = shapes[l][0], w = shapes[l][1];
    const auto m = padding_mask.slice(1, cur, cur + h * w).view({B, h, w, 1});
    const auto valid_h = m.select(2, 0).select(2, 0).logical_not().sum(1);
    const auto valid_w = m.select(1, 0).select(2, 0).logical_not().sum(1);
    const auto grids =
        at::meshgrid({at::linspace(0, h - 1, h, opts), at::linspace(0, w - 1, w, opts)}, "ij");
    auto grid = at::cat({grids[1].unsqueeze(-1), grids[0].unsqueeze(-1)}, -1);
    const auto scale =
        at::cat({valid_w.unsqueeze(-1), valid_h.unsqueeze(-1)}, 1).view({B, 1, 1, 2});
    grid = (grid.unsqueeze(0).expand({B, -1, -1, -1}) + 0.5) / scale;
    const auto wh = at::ones_like(grid) * 0.05 * std::pow(2.0, static_cast<double>(l));
    proposals.push_back(at::cat({grid, wh}, -1).view({B, -1, 4}));
    cur += h * w;
  }
  auto out = at::cat(proposals, 1);
  const auto valid = ((out > 0.01) & (out < 0.99)).all(-1, /*keepdim=*/true);
  out = at::log(out / (1 - out));
  const double inf = std::numeric_limits<double>::infinity();
  out = out.masked_fill(padding_mask.unsqueeze(-1), inf);
  out = out.masked_fill(valid.logical_not(), inf);
  auto q = memory.masked_fill(padding_mask.unsqueeze(-1), 0.0);
  q = q.masked_fill(valid.logical_not(), 0.0);
  return {q, out};
}

at::Tensor proposal_position_embedding(const at::Tensor& proposals, int64_t num_features) {
  const auto d = dim_t(num_features, at::kFloat, proposals.device());
  const auto p = proposals.sigmoid().to(at::kFloat) * kTwoPi;
  const auto pos = p.unsqueeze(-1) / d;  // (B, K, 4, F)
  return at::stack({pos.slice(3, 0, c10::nullopt, 2).sin(), pos.slice(3, 1, c10::nullopt, 2).cos()},
                   4)
      .flatten(2)
      .to(proposals.scalar_type());
}

at::Tensor anchor_position_embedding(const at::Tensor& anchors, int64_t num_features) {
  const auto d = dim_t(num_features, at::kFloat, anchors.device());
  // coord[..., None] * scale / dim_t, per coordinate; (..., n, F) then the coordinates unbound.
  auto parts = interleave_sin_cos((anchors * kTwoPi).unsqueeze(-1) / d).unbind(-2);
  if (parts.size() >= 2) std::swap(parts[0], parts[1]);
  return at::cat(parts, -1).to(anchors.scalar_type());
}

}  // namespace libreyolo::models::deformable_detr
