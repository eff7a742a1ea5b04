// An out-of-tree kernel plugin, as a user would write one: a shared library whose static
// initialiser registers implementations into the process registry. Loaded by the
// LIBREYOLO_KERNEL_PLUGINS test; its `plugin` fake_quant_fp8 returns x * 0 + 42 so that the
// test can tell it ran.
#include "kernels/quant/fake_quant_fp8.h"

namespace {

const bool registered = [] {
  libreyolo::kernels::Registry::global().register_impl(
      libreyolo::kernels::kFakeQuantFp8, "plugin",
      libreyolo::kernels::FakeQuantFp8Impl{
          [](const at::Tensor& x, const at::Tensor&) -> libreyolo::kernels::Outcome<at::Tensor> {
            return at::full_like(x, 42.0);
          }});
  return true;
}();

}  // namespace
