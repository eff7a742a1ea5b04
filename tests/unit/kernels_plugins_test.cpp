// Out-of-tree plugins (the `plugins` provider) and the provider gate of LIBREYOLO_KERNELS=off:
// tests/plugin/test_plugin.cpp is built by the suite as a shared library.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "kernels/kernels.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "log/log.h"

namespace libreyolo::kernels {
namespace {

const std::string kPlugin = std::string(LIBREYOLO_BINARY_DIR) + "/lib/libreyolo_test_plugin.so";

TEST(KernelPlugins, ReferenceOnlyPolicyNeverLoadsPlugins) {
  Registry r;
  register_builtin_slots(r);
  r.add_provider(make_plugins_provider(kPlugin));
  r.set_filter(policy_from_environment({{"LIBREYOLO_KERNELS", "off"}}).filter());
  r.resolve();
  EXPECT_TRUE(r.loaded_providers().empty());
  r.set_filter(policy_from_environment({{"LIBREYOLO_KERNELS", "Reference"}}).filter());
  r.resolve();
  EXPECT_TRUE(r.loaded_providers().empty());
  ASSERT_EQ(r.providers().size(), 1u);
  EXPECT_EQ(r.providers()[0].state, "disabled by policy");
}

TEST(KernelPlugins, PluginsRegisterIntoTheirRegistryBrokenOnesAreLoggedAndSkipped) {
  log::Capture capture;
  const std::string broken = ::testing::TempDir() + "/libbroken_plugin.so";
  {
    std::ofstream f(broken);
    f << "this is not an ELF file\n";
  }
  const std::string missing = "/nonexistent/libmissing.so";
  const size_t default_events = Registry::process_default().events().size();

  Registry r;
  register_builtin_slots(r);
  apply_policy(r, policy_from_environment(
                      {{"LIBREYOLO_KERNEL_PLUGINS", missing + ":" + broken + ":" + kPlugin},
                       {"LIBREYOLO_HUB_KERNELS", "0"}}));
  const auto loaded = r.loaded_providers();
  EXPECT_NE(std::find(loaded.begin(), loaded.end(), "plugins"), loaded.end());
  std::vector<FallbackEvent> ev;
  for (const auto& e : r.events()) {
    if (e.impl.rfind("plugin:", 0) == 0) ev.push_back(e);
  }
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].impl, "plugin:" + missing);
  EXPECT_NE(ev[0].reason.find("No such file or directory"), std::string::npos) << ev[0].reason;
  EXPECT_EQ(ev[1].impl, "plugin:" + broken);
  EXPECT_NE(ev[1].reason.find("plugin not loaded"), std::string::npos) << ev[1].reason;
  EXPECT_EQ(capture.count(log::Level::warn, "plugin not loaded"), 2);
  // No hidden global: the plugin registered into the registry that loaded it, not the default.
  EXPECT_EQ(Registry::process_default().events().size(), default_events);
  const auto default_impls = Registry::process_default().iter_impls(kFakeQuantFp8.name);
  EXPECT_EQ(std::count(default_impls.begin(), default_impls.end(), "plugin"), 0);

  EXPECT_EQ(r.resolve(kFakeQuantFp8.name), "plugin");
  const auto handle = r.bind(kFakeQuantFp8, BindContext{});
  at::Tensor y = fake_quant_fp8(handle, at::ones({3}), at::ones({1}));
  EXPECT_TRUE(at::equal(y, at::full({3}, 42.0)));
  // A model's policy that leaves the plugin out binds the reference.
  const Filter only_reference = r.filter().overridden({{"fake_quant_fp8", {"reference"}}});
  const auto ref = r.bind(kFakeQuantFp8, BindContext{}, &only_reference);
  EXPECT_FLOAT_EQ(fake_quant_fp8(ref, at::ones({1}), at::ones({1})).item<float>(), 1.0f);
  // The `plugin` name is known now: a policy may name it.
  EXPECT_NO_THROW(check_names(policy_from_environment({{"LIBREYOLO_KERNELS", "plugin"}}), r));
  std::remove(broken.c_str());
}

TEST(KernelPlugins, ALibraryWithoutTheRegistrationFunctionIsSkipped) {
  log::Capture capture;
  Registry r;
  register_builtin_slots(r);
  // A real shared library without libreyolo_register_kernels: the registry library itself.
  const std::string lib = std::string(LIBREYOLO_BINARY_DIR) + "/lib/libreyolo_registry.so";
  r.add_provider(make_plugins_provider(lib));
  r.resolve();
  ASSERT_EQ(r.events().size(), 1u);
  EXPECT_EQ(r.events()[0].impl, "plugin:" + lib);
  EXPECT_EQ(r.events()[0].reason, "plugin not loaded: no extern \"C\" libreyolo_register_kernels");
}

}  // namespace
}  // namespace libreyolo::kernels
