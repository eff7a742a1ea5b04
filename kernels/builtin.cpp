#include <sstream>

#include "kernels/hub/provider.h"
#include "kernels/kernels.h"
#include "log/log.h"

namespace libreyolo::kernels {

#ifdef LIBREYOLO_WITH_CUDA
// Defined by the CUDA sources (kernels/*/cuda/): registers every `cuda` implementation.
void register_cuda_kernels(Registry& registry);
#endif

// Defined next to each op.
void register_fake_quant_fp8_reference(Registry& registry);

Registry& Registry::global() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never destroyed: kernels may run during static destruction
    const Environment env = process_environment();
    register_references(*r);
    add_builtin_providers(*r, env);
    r->set_filter(policy_from_environment(env).filter());
    return r;
  }();
  return *registry;
}

void register_references(Registry& registry) {
  registry.declare_slot("ms_deform_attn");  // no reference: callers keep the portable path
  register_fake_quant_fp8_reference(registry);
}

bool built_with_cuda() {
#ifdef LIBREYOLO_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void add_builtin_providers(Registry& registry, const Environment& env) {
#ifdef LIBREYOLO_WITH_CUDA
  registry.add_provider({"cuda", [](Registry& r) { register_cuda_kernels(r); }});
#endif
  auto it = env.find("LIBREYOLO_KERNEL_PLUGINS");
  if (it != env.end() && !it->second.empty()) {
    const std::string paths = it->second;
    registry.add_provider({"plugins", [paths](Registry& r) { load_plugins(r, paths); }});
  }
  // "hub" (kernels/hub/provider.h): kernels-hub builds pinned in kernels.lock. Its settings are
  // the policy's once initialize() stored them, else the environment's. The registry never runs
  // it when the filter disables "hub" (hub_kernels: off, LIBREYOLO_HUB_KERNELS=0).
  registry.add_provider(hub::make_provider([env] {
    hub::ProviderOptions options;
    auto stored = hub::process_settings();
    options.settings = stored ? *stored : policy_from_environment(env).hub;
    return options;
  }));
}

void initialize(const Policy& policy) {
  auto& r = Registry::global();
  hub::set_process_settings(policy.hub);  // before the resolve that runs the hub provider
  r.set_filter(policy.filter());
  r.resolve();
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
