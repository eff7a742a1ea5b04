// An out-of-tree kernel plugin, as a user would write one: a shared library exporting the plugin
// ABI's registration function (kernels/kernels.h make_plugins_provider), which registers into
// the registry that loads it. Its `plugin` fake_quant_fp8 returns x * 0 + 42 so that the test
// can tell it ran.
#include "kernels/quant/fake_quant_fp8.h"

extern "C" void libreyolo_register_kernels(libreyolo::kernels::Registry& registry) {
  registry.register_impl(
      libreyolo::kernels::kFakeQuantFp8, "plugin",
      [](const at::Tensor& x, const at::Tensor&) -> libreyolo::kernels::Outcome<at::Tensor> {
        return at::full_like(x, 42.0);
      });
}
