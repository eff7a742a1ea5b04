// LW-DETR two-stage query selection, in transformers 5.17's operation order.
#include "models/lw_detr/two_stage.h"

#include <c10/util/StringUtil.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/layers/gather_rows.h"

namespace libreyolo::models::lw_detr {
namespace {

template <class T, class... Args>
std::shared_ptr<T> make(Args&&... args) {
  return std::make_shared<T>(std::forward<Args>(args)...);
}

}  // namespace

at::Tensor refine_boxes(const at::Tensor& reference, const at::Tensor& deltas) {
  // Upstream's ops, each rounded to the dtype as there, written into their halves of the output
  // in place of upstream's concatenation.
  const auto ref_xy = reference.slice(-1, 0, 2), ref_wh = reference.slice(-1, 2);
  auto out = at::empty(at::infer_size(reference.sizes(), deltas.sizes()),
                       deltas.options().dtype(at::result_type(reference, deltas)));
  auto xy = out.slice(-1, 0, 2), wh = out.slice(-1, 2);
  at::mul_out(xy, deltas.slice(-1, 0, 2), ref_wh).add_(ref_xy);
  at::exp_out(wh, deltas.slice(-1, 2).expand_as(wh)).mul_(ref_wh);
  return out;
}

Proposals encoder_output_proposals(const at::Tensor& memory, const at::Tensor& padding_mask,
                                   const kernels::SpatialShapes& shapes) {
  const int64_t B = memory.size(0);
  const auto opts = memory.options();
  std::vector<at::Tensor> proposals;
  int64_t cur = 0;
  for (size_t level = 0; level < shapes.size(); ++level) {
    const int64_t h = shapes[level][0], w = shapes[level][1];
    const auto m = padding_mask.slice(1, cur, cur + h * w).view({B, h, w, 1});
    const auto valid_h = m.select(2, 0).select(-1, 0).logical_not().sum(1);
    const auto valid_w = m.select(1, 0).select(-1, 0).logical_not().sum(1);
    const auto grids =
        at::meshgrid({at::linspace(0, h - 1, h, opts), at::linspace(0, w - 1, w, opts)}, "ij");
    const auto grid = at::cat({grids[1].unsqueeze(-1), grids[0].unsqueeze(-1)}, -1);
    const auto scale =
        at::cat({valid_w.unsqueeze(-1), valid_h.unsqueeze(-1)}, 1).view({B, 1, 1, 2});
    const auto g = (grid.unsqueeze(0).expand({B, -1, -1, -1}) + 0.5) / scale;
    const auto wh = at::ones_like(g) * 0.05 * std::pow(2.0, static_cast<double>(level));
    proposals.push_back(at::cat({g, wh}, -1).view({B, -1, 4}));
    cur += h * w;
  }
  auto out = at::cat(proposals, 1);
  const auto valid = ((out > 0.01) & (out < 0.99)).all(-1, /*keepdim=*/true);
  const auto invalid = padding_mask.unsqueeze(-1) | valid.logical_not();
  return {memory.masked_fill(invalid, 0.0), out.masked_fill(invalid, 0.0), invalid};
}

QuerySelection::QuerySelection(torch::nn::Module& model, const DetrConfig& c)
    : num_queries(c.num_queries), model_type(c.model_type) {
  const int64_t d = c.d_model, n = c.num_queries * c.group_detr;
  for (int64_t g = 0; g < c.group_detr; ++g) {
    enc_output.push_back(make<layers::LinearImpl>(d, d));
    enc_output_norm.push_back(make<layers::LayerNormImpl>(d, 1e-5));
    enc_out_bbox_embed.push_back(make<layers::MLPImpl>(d, d, 4, 3, layers::Activation::relu));
    enc_out_class_embed.push_back(make<layers::LinearImpl>(d, c.num_labels));
  }
  layers::register_list(model, "enc_output", enc_output);
  layers::register_list(model, "enc_output_norm", enc_output_norm);
  layers::register_list(model, "enc_out_bbox_embed", enc_out_bbox_embed);
  layers::register_list(model, "enc_out_class_embed", enc_out_class_embed);
  auto qf = model.register_module("query_feat", make<torch::nn::Module>());
  query_feat = qf->register_parameter("weight", at::empty({n, d}));
  auto rp = model.register_module("reference_point_embed", make<torch::nn::Module>());
  reference_point_embed = rp->register_parameter("weight", at::empty({n, 4}));
}

QuerySelection::Queries QuerySelection::forward(const at::Tensor& memory,
                                                const at::Tensor& memory_mask,
                                                const kernels::SpatialShapes& shapes) const {
  const int64_t B = memory.size(0), S = memory.size(1);
  if (S < num_queries)
    throw std::invalid_argument(c10::str(model_type, ": num_queries = ", num_queries,
                                         " exceeds the ", S, " projector tokens of the input"));
  Proposals p;
  if (memory_mask.defined()) {
    p = encoder_output_proposals(memory, memory_mask.logical_not(), shapes);
  } else {
    // No padding: the proposals and their validity depend on the shapes alone; computed once per
    // geometry (for one image, shared by the batch) by the same function on an unpadded mask.
    std::vector<int64_t> key{static_cast<int64_t>(memory.scalar_type())};
    for (const auto& s : shapes) key.insert(key.end(), {s[0], s[1]});
    auto unpadded = [&] {
      const auto none = at::zeros({1, S}, memory.options().dtype(at::kBool));
      return encoder_output_proposals(memory.narrow(0, 0, 1), none, shapes);
    };
    p.proposals = proposals_.get(key, memory.device(), [&] { return unpadded().proposals; });
    p.invalid = invalid_.get(key, memory.device(), [&] { return unpadded().invalid; });
    p.object_query = at::where(p.invalid, 0.0, memory);  // masked_fill's values, no clone first
  }
  // Group 0 only (LwDetrModel.forward: group_detr = 1 when not training).
  const auto q = enc_output_norm[0]->forward(enc_output[0]->forward(p.object_query));
  auto cls = enc_out_class_embed[0]->forward(q);  // its own output: filled in place
  cls.masked_fill_(p.invalid, -std::numeric_limits<double>::infinity());
  const auto topk = std::get<1>(at::topk(std::get<0>(cls.max(-1)), num_queries, 1));
  // The box head and the refinement on the selected tokens only (upstream runs them on all S
  // and gathers): both are row-wise, so the gathered rows are the same.
  const auto topk_coords =
      refine_boxes(layers::gather_rows(p.proposals, topk),
                   enc_out_bbox_embed[0]->forward(layers::gather_rows(q, topk)));
  const auto ref_embed =
      reference_point_embed.slice(0, 0, num_queries).unsqueeze(0).expand({B, -1, -1});
  Queries out;
  out.target = query_feat.slice(0, 0, num_queries).unsqueeze(0).expand({B, -1, -1});
  out.reference_points = refine_boxes(topk_coords, ref_embed);
  return out;
}

}  // namespace libreyolo::models::lw_detr
