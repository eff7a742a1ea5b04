// The `cuda` implementation of the `ms_deform_attn` slot: per-call input checks (Decline, never
// throw), the autograd wiring of the CUDA forward/backward kernels, and its registration.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <vector>

#include "kernels/attention/cuda/ms_deform_attn_cuda.h"
#include "kernels/attention/ms_deform_attn.h"

namespace libreyolo::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Differentiable wrapper: the slot result carries a grad_fn that runs the CUDA backward.
struct MsDeformAttnFunction : torch::autograd::Function<MsDeformAttnFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& value,
                            const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                            const at::Tensor& sampling_locations,
                            const at::Tensor& attention_weights) {
    ctx->save_for_backward(
        {value, spatial_shapes, level_start_index, sampling_locations, attention_weights});
    return cuda::ms_deform_attn_forward(value, spatial_shapes, level_start_index,
                                        sampling_locations, attention_weights);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    if (!grad_outputs[0].defined()) return variable_list(5);
    auto [grad_value, grad_loc, grad_attn] = cuda::ms_deform_attn_backward(
        saved[0], saved[1], saved[2], saved[3], saved[4], grad_outputs[0]);
    return {grad_value, at::Tensor(), at::Tensor(), grad_loc, grad_attn};
  }
};

// Inference tensors (made under at::InferenceMode, as the daemon runs) have no version counter:
// `_version()` throws on them. They cannot be modified outside inference mode, so identity alone
// keys them; the kernel's own bounds checks cover in-place edits made inside inference mode.
uint32_t version_of(const at::Tensor& t) { return t.is_inference() ? 0 : t._version(); }

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// Host-side check of the spatial metadata (one small device-to-host copy, i.e. a sync). The last
// few validated (spatial_shapes, level_start_index) tensors are remembered by identity and version
// so that models holding their metadata tensors pay the copy once, not per call.
class MetadataCache {
 public:
  bool valid(const at::Tensor& shapes, const at::Tensor& starts, int64_t S) {
    for (const auto& e : entries_) {
      if (e.S == S && e.shapes_version == version_of(shapes) &&
          e.starts_version == version_of(starts) &&
          e.shapes.lock().get() == shapes.unsafeGetTensorImpl() &&
          e.starts.lock().get() == starts.unsafeGetTensorImpl())
        return true;
    }
    if (!check(shapes, starts, S)) return false;
    Entry& e = entries_[next_];
    e.shapes = Weak(shapes.getIntrusivePtr());
    e.starts = Weak(starts.getIntrusivePtr());
    e.shapes_version = version_of(shapes);
    e.starts_version = version_of(starts);
    e.S = S;
    next_ = (next_ + 1) % entries_.size();
    return true;
  }

 private:
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct Entry {
    Weak shapes{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    Weak starts{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    uint32_t shapes_version = 0;
    uint32_t starts_version = 0;
    int64_t S = -1;
  };

  static bool check(const at::Tensor& shapes, const at::Tensor& starts, int64_t S) {
    const auto hs = shapes.to(at::kCPU).contiguous();
    const auto st = starts.to(at::kCPU).contiguous();
    const int64_t* h = hs.const_data_ptr<int64_t>();
    const int64_t* s = st.const_data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t l = 0; l < hs.size(0); ++l) {
      const int64_t H = h[2 * l], W = h[2 * l + 1];
      if (H <= 0 || W <= 0 || H > INT32_MAX || W > INT32_MAX || s[l] != total) return false;
      total += H * W;
    }
    return total == S;
  }

  std::array<Entry, 8> entries_{};
  size_t next_ = 0;
};

bool metadata_valid(const at::Tensor& shapes, const at::Tensor& starts, int64_t S) {
  thread_local MetadataCache cache;
  return cache.valid(shapes, starts, S);
}

bool floating(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

Outcome<at::Tensor> ms_deform_attn_cuda(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                        const at::Tensor& level_start_index,
                                        const at::Tensor& sampling_locations,
                                        const at::Tensor& attention_weights) {
  const std::array<const at::Tensor*, 5> all{&value, &spatial_shapes, &level_start_index,
                                             &sampling_locations, &attention_weights};
  for (const auto* t : all)
    if (!t->defined() || !t->is_cuda()) return Decline{"cpu tensor"};
  for (const auto* t : all)
    if (t->device() != value.device()) return Decline{"device mismatch"};
  const auto vt = value.scalar_type(), lt = sampling_locations.scalar_type();
  if (!floating(vt) || !floating(lt) || attention_weights.scalar_type() != lt ||
      (lt != vt && lt != at::kFloat))
    return Decline{"unsupported dtype"};
  if (spatial_shapes.scalar_type() != at::kLong || level_start_index.scalar_type() != at::kLong)
    return Decline{"malformed spatial metadata"};
  if (value.dim() != 4 || sampling_locations.dim() != 6 || attention_weights.dim() != 5 ||
      spatial_shapes.dim() != 2 || level_start_index.dim() != 1)
    return Decline{"shape mismatch"};
  const int64_t B = value.size(0), S = value.size(1), H = value.size(2), C = value.size(3);
  const int64_t Q = sampling_locations.size(1), L = sampling_locations.size(3),
                P = sampling_locations.size(4);
  if (sampling_locations.size(0) != B || sampling_locations.size(2) != H ||
      sampling_locations.size(5) != 2 || attention_weights.size(0) != B ||
      attention_weights.size(1) != Q || attention_weights.size(2) != H ||
      attention_weights.size(3) != L || attention_weights.size(4) != P ||
      spatial_shapes.size(0) != L || spatial_shapes.size(1) != 2 || level_start_index.size(0) != L)
    return Decline{"shape mismatch"};
  if (L < 1 || L > cuda::kMaxLevels || H > INT32_MAX || C > INT32_MAX || L * P > INT32_MAX)
    return Decline{"unsupported size"};
  // The host check reads device memory: skipped during CUDA graph capture, where the kernel's own
  // bounds checks keep malformed metadata from reading out of bounds.
  if (!capturing() && !metadata_valid(spatial_shapes, level_start_index, S))
    return Decline{"malformed spatial metadata"};
  // No autograd node when nothing needs a gradient (inference mode, no_grad, frozen inputs):
  // the graph wiring costs host time and cannot save inference tensors for backward.
  const bool needs_grad =
      at::GradMode::is_enabled() && (value.requires_grad() || sampling_locations.requires_grad() ||
                                     attention_weights.requires_grad());
  if (!needs_grad)
    return cuda::ms_deform_attn_forward(
        value.contiguous(), spatial_shapes.contiguous(), level_start_index.contiguous(),
        sampling_locations.contiguous(), attention_weights.contiguous());
  return MsDeformAttnFunction::apply(
      value.contiguous(), spatial_shapes.contiguous(), level_start_index.contiguous(),
      sampling_locations.contiguous(), attention_weights.contiguous());
}

}  // namespace

/// Registers `cuda` for `ms_deform_attn` (eligible when a CUDA device is present).
void register_ms_deform_attn_cuda(Registry& registry) {
  registry.register_impl(
      kMsDeformAttn, "cuda", MsDeformAttnImpl(&ms_deform_attn_cuda),
      [] { return at::cuda::is_available(); }, cuda_models_only);
}

}  // namespace libreyolo::kernels
