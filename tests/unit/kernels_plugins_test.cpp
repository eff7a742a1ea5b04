// Out-of-tree plugins (issue 2, test 9) and the provider gate of LIBREYOLO_KERNELS=off on the
// real providers: tests/plugin/test_plugin.cpp is built by the suite as a shared library.
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
  add_builtin_providers(r, {{"LIBREYOLO_KERNEL_PLUGINS", kPlugin}});
  r.set_filter(policy_from_environment({{"LIBREYOLO_KERNELS", "off"}}).filter());
  r.resolve();
  EXPECT_TRUE(r.loaded_providers().empty());
  r.set_filter(policy_from_environment({{"LIBREYOLO_KERNELS", "Reference"}}).filter());
  r.resolve();
  EXPECT_TRUE(r.loaded_providers().empty());
}

TEST(KernelPlugins, PluginsRegisterBrokenOnesAreLoggedAndSkipped) {
  log::Capture capture;
  const std::string broken = ::testing::TempDir() + "/libbroken_plugin.so";
  {
    std::ofstream f(broken);
    f << "this is not an ELF file\n";
  }
  const std::string missing = "/nonexistent/libmissing.so";
  auto& global = Registry::global();
  global.resolve();  // built-in providers first (on a GPU machine: `cuda`): the plugin is newer
  const size_t events_before = global.events().size();

  Registry r;  // the provider runs through a registry; the plugin registers into the global one
  add_builtin_providers(r, {{"LIBREYOLO_KERNEL_PLUGINS", missing + ":" + broken + ":" + kPlugin}});
  r.resolve();
  const auto loaded = r.loaded_providers();
  EXPECT_NE(std::find(loaded.begin(), loaded.end(), "plugins"), loaded.end());
  std::vector<FallbackEvent> ev;  // other built-in providers (cuda, hub) may add their own
  for (const auto& e : r.events()) {
    if (e.impl.rfind("plugin:", 0) == 0) ev.push_back(e);
  }
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].impl, "plugin:" + missing);
  EXPECT_NE(ev[0].reason.find("No such file or directory"), std::string::npos) << ev[0].reason;
  EXPECT_EQ(ev[1].impl, "plugin:" + broken);
  EXPECT_NE(ev[1].reason.find("plugin not loaded"), std::string::npos) << ev[1].reason;
  EXPECT_EQ(capture.count(log::Level::warn, "plugin not loaded"), 2);
  EXPECT_EQ(global.events().size(), events_before);

  // The plugin's static initialiser registered `plugin` for fake_quant_fp8, newest first.
  EXPECT_EQ(global.resolve(kFakeQuantFp8), "plugin");
  at::Tensor y = fake_quant_fp8(at::ones({3}), at::ones({1}));
  EXPECT_TRUE(at::equal(y, at::full({3}, 42.0)));
  // Forcing another name leaves the plugin out; the reference is still there.
  Filter keep = global.filter();
  Filter only;
  only.mode = Filter::Mode::only_name;
  only.name = "cuda";
  global.set_filter(only);
  EXPECT_FLOAT_EQ(fake_quant_fp8(at::ones({1}), at::ones({1})).item<float>(), 1.0f);
  global.set_filter(keep);
  EXPECT_EQ(global.unregister_impl(kFakeQuantFp8, "plugin"), 1);
  const auto impls = global.iter_impls(kFakeQuantFp8);
  EXPECT_EQ(std::count(impls.begin(), impls.end(), "plugin"), 0);
  EXPECT_EQ(impls.back(), "reference");
  std::remove(broken.c_str());
}

}  // namespace
}  // namespace libreyolo::kernels
