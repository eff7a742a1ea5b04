// The `hub` binding of ms_deform_attn: kernels-community/deformable-detr's
// `<id>::ms_deform_attn_forward(value, spatial_shapes, level_start_index, sampling_loc,
// attn_weight, int im2col_step)` (its torch_binding.cpp), wrapped as the slot's `hub`
// implementation. The generic loader is kernels/hub/provider.cpp.
#include <c10/util/StringUtil.h>

#include <sstream>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/hub/binding.h"

namespace libreyolo::kernels::hub {
namespace {

using ForwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, const at::Tensor&, int64_t);

// Largest divisor of B that is <= 64 (the op requires B % min(B, im2col_step) == 0;
// transformers passes 64).
int64_t im2col_step_for(int64_t batch) {
  for (int64_t step = std::min<int64_t>(batch, 64); step > 1; --step) {
    if (batch % step == 0) return step;
  }
  return 1;
}

MsDeformAttnImpl make_impl(std::shared_ptr<LazyHubOp> state) {
  return [state](const at::Tensor& value, const at::Tensor& spatial_shapes,
                 const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                 const at::Tensor& attention_weights) -> Outcome<at::Tensor> {
    const bool capturing = state->capturing();
    auto op = state->get();
    if (!op) {
      if (capturing) return Decline{"hub: not loaded yet, CUDA graph capture"};
      op = state->load_now();  // throws: the registry disables `hub` with one warning
    }
    if (capturing && !state->warmed.load())
      return Decline{"hub: first call inside CUDA graph capture"};
    const bool on_cuda = value.is_cuda();
    if ((op->backend == "cuda") != on_cuda || (op->backend == "cpu" && !value.is_cpu())) {
      return Decline{"hub: tensors on another device than the build"};
    }
    const auto dtype = value.scalar_type();
    if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
      return Decline{"hub: dtype (float32, float16, bfloat16 only)"};
    }
    if (at::GradMode::is_enabled() &&
        (value.requires_grad() || sampling_locations.requires_grad() ||
         attention_weights.requires_grad())) {
      return Decline{"hub: autograd (the hub op has no autograd kernel)"};
    }
    if (value.dim() != 4 || sampling_locations.dim() != 6 || attention_weights.dim() != 5) {
      return Decline{"hub: layout"};
    }
    // fp16/bf16 by upcast (docs/DESIGN.md "Slots": the accelerated paths accumulate in float32).
    const auto v = value.to(at::kFloat).contiguous();
    const auto loc = sampling_locations.to(at::kFloat).contiguous();
    const auto w = attention_weights.to(at::kFloat).contiguous();
    const auto shapes = spatial_shapes.to(at::kLong).contiguous();
    const auto start = level_start_index.to(at::kLong).contiguous();
    const int64_t B = v.size(0), H = v.size(2), C = v.size(3), Q = loc.size(1);
    at::Tensor out =
        op->handle.typed<ForwardFn>().call(v, shapes, start, loc, w, im2col_step_for(B));
    if (!out.defined() || out.sizes() != at::IntArrayRef({B, Q, H * C})) {
      std::ostringstream os;
      os << "hub op " << op->description << " returned "
         << (out.defined() ? c10::str(out.sizes()) : std::string("an undefined tensor"))
         << ", expected [" << B << ", " << Q << ", " << H * C << "]";
      throw std::runtime_error(os.str());
    }
    if (!capturing) state->warmed.store(true);
    return dtype == at::kFloat ? out : out.to(dtype);
  };
}

}  // namespace

std::vector<HubBinding> builtin_bindings() {
  HubBinding ms;
  ms.slot = kMsDeformAttn.name;
  ms.op = "ms_deform_attn_forward";
  ms.schema = kMsDeformAttnForwardSchema;
  ms.install = [](Registry& registry, std::shared_ptr<LazyHubOp> op) {
    registry.register_impl(kMsDeformAttn, "hub", make_impl(std::move(op)));
  };
  return {ms};
}

}  // namespace libreyolo::kernels::hub
