// The process registry's built-in content and the start-up that applies the policy to it.
#include <sstream>

#include "kernels/attention/dot_product_attention.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/attention/rotary_embedding.h"
#include "kernels/attention/sampling_locations.h"
#include "kernels/box/refine_boxes.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/gemm/fp8_gemm.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/hub/provider.h"
#include "kernels/image/image_decode.h"
#include "kernels/image/image_preprocess.h"
#include "kernels/kernels.h"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "log/log.h"

namespace libreyolo::kernels {

#ifdef LIBREYOLO_WITH_CUDA
// Defined by the CUDA sources (kernels/*/cuda/): registers every `cuda` implementation.
void register_cuda_kernels(Registry& registry);
bool cuda_device_usable();
#endif

// Defined next to each op.
void register_fake_quant_fp8_reference(Registry& registry);
void register_attention_implementations(Registry& registry);
void register_conv2d_bias_act_onednn(Registry& registry);  // conv/cpu/conv2d_bias_act_onednn.cpp
// conv/cpu/conv2d_bias_act_winograd.cpp
void register_conv2d_bias_act_winograd(Registry& registry);
void register_linear_act_onednn(Registry& registry);   // gemm/cpu/linear_act_onednn.cpp (+ linear)
void register_ms_deform_attn_cpu(Registry& registry);  // attention/cpu/ms_deform_attn_cpu.cpp
void register_max_pool2d_cpu(Registry& registry);      // pool/cpu/max_pool2d_cpu.cpp

Registry& Registry::process_default() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never destroyed: kernels may run during static destruction
    register_builtin_slots(*r);
    if (auto cuda = make_cuda_provider()) r->add_provider(std::move(cuda));
    if (auto nvjpeg = make_nvjpeg_provider()) r->add_provider(std::move(nvjpeg));
    return r;
  }();
  return *registry;
}

void register_builtin_slots(Registry& registry) {
  registry.declare(kMsDeformAttn);  // no reference: callers keep the portable path
  register_ms_deform_attn_cpu(registry);
  registry.declare(kSamplingLocations);  // no reference: sampling_locations_portable
  registry.declare(kRefineBoxes);        // no reference: refine_boxes_portable
  registry.declare(kRotaryEmbedding);    // no reference: rotary_embedding_portable
  registry.declare(kConv2dBiasAct);      // no reference: conv2d_bias_act_portable
  register_conv2d_bias_act_onednn(registry);
  // Newest first: tried before `onednn` (3x3 stride-1 convolutions only).
  register_conv2d_bias_act_winograd(registry);
  registry.declare(kMaxPool2d);  // no reference: max_pool2d_portable
  register_max_pool2d_cpu(registry);
  registry.declare(kAddLayerNorm);  // no reference: add_layer_norm_portable
  // The reference (libjpeg-turbo / libpng) is registered by libreyolo_models, where that
  // decoder lives (models/image/decode_slot.cpp); the `nvjpeg` provider adds the GPU decoder.
  registry.declare(kImageDecode);
  registry.declare(kImageDecodeBatch);  // no reference: image_decode one image at a time
  registry.declare(kLinearAct);         // no reference: linear_act_portable
  registry.declare(kLinear);            // no reference: at::linear
  register_linear_act_onednn(registry);
  registry.declare(kFp8Gemm);  // no reference: the dense Linear (fp8_linear)
  // No reference: the image processor's ATen ops (models/image/preprocess_slot.h).
  registry.declare(kImagePreprocess);
  register_fake_quant_fp8_reference(registry);
  register_attention_implementations(registry);
}

bool built_with_cuda() {
#ifdef LIBREYOLO_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

#ifdef LIBREYOLO_WITH_CUDA
class CudaProvider : public Provider {
 public:
  std::string name() const override { return "cuda"; }
  const char* unavailable() const override {
    return cuda_device_usable() ? nullptr : "no usable CUDA device";
  }
  void load(Registry& registry) override { register_cuda_kernels(registry); }
};
#endif

}  // namespace

#ifndef LIBREYOLO_WITH_CUDA
std::shared_ptr<Provider> make_nvjpeg_provider() { return nullptr; }
#endif

std::shared_ptr<Provider> make_cuda_provider() {
#ifdef LIBREYOLO_WITH_CUDA
  return std::make_shared<CudaProvider>();
#else
  return nullptr;
#endif
}

void apply_policy(Registry& registry, const Policy& policy) {
  if (!policy.plugins.value.empty() && !registry.has_provider("plugins"))
    registry.add_provider(make_plugins_provider(policy.plugins.value));
  if (!registry.has_provider(hub::kProviderName)) {
    hub::ProviderOptions options;
    options.settings = policy.hub;
    registry.add_provider(hub::make_provider(std::move(options)));
  }
  registry.set_filter(policy.filter());
  registry.resolve();
  check_names(policy, registry);
}

void initialize(const Policy& policy) {
  auto& r = Registry::process_default();
  apply_policy(r, policy);
  log::info("kernel policy:\n" + policy.describe());
  log::info("kernel slots:\n" + format_table(r.report()));
}

std::string format_table(const std::vector<SlotReport>& report) {
  std::ostringstream os;
  for (const auto& s : report) {
    os << s.slot << " -> " << s.selected;
    if (s.selected == kUnavailable) os << " (portable path)";
    os << "\n";
    for (const auto& c : s.candidates) {
      os << "    " << (c.eligible ? "+ " : "- ") << c.name;
      if (!c.eligible) os << "  [" << c.reason << "]";
      os << "  calls=" << c.calls;
      for (const auto& [why, n] : c.declined) os << " declined[" << why << "]=" << n;
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace libreyolo::kernels
