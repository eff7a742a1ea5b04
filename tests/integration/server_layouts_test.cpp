// The daemon's layouts: the server's kernels.layouts, serving.yaml `kernel_config:` per model,
// what /active reports per model, and a hub layout refused at load with its reason.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/app/daemon.h"
#include "server/config/serving_config.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using nlohmann::json;
using namespace testing;

const json* model_entry(const json& active, const std::string& name) {
  for (const auto& m : active.at("models"))
    if (m.at("name") == name) return &m;
  return nullptr;
}

const json* layout_entry(const json& model, const std::string& layout) {
  for (const auto& l : model.at("layouts"))
    if (l.at("layout") == layout) return &l;
  return nullptr;
}

TEST(ServerLayouts, KernelConfigPerModelAndActiveReport) {
  const auto repo = temp_dir("layouts");
  add_fixture_model(repo, "rt_on", "rtdetr_tiny", "warmup: false\n");
  add_fixture_model(repo, "rt_backbone_off", "rtdetr_tiny",
                    "warmup: false\nkernel_config:\n  RTDetrResNetConvLayer: off\n"
                    "  RTDetrResNetShortCut: off\n");
  add_fixture_model(repo, "rt_hub", "rtdetr_tiny",
                    "warmup: false\nkernel_config:\n  RTDetrSelfAttention: acme/attn:Fused\n");
  Daemon daemon(loopback_config(repo, "cpu", "kernels:\n  layouts: on\n"), fake_or_real());
  daemon.start();
  const auto reply = http_get(daemon.http_port(), "/active");
  ASSERT_EQ(reply.status, 200);
  const json active = json::parse(reply.body);
  EXPECT_EQ(active.at("policy").at("layouts").at("value"), "on");
  EXPECT_EQ(active.at("policy").at("layouts").at("source"), "file");

  const json* on = model_entry(active, "rt_on");
  ASSERT_NE(on, nullptr);
  ASSERT_EQ(on->at("state"), "READY") << on->dump();
  const json* fold = layout_entry(*on, "batchnorm_fold");
  ASSERT_NE(fold, nullptr) << on->dump();
  EXPECT_EQ(fold->at("source").get<std::string>().rfind("kernels.layouts: on", 0), 0u);
  EXPECT_EQ(fold->at("classes"), json({"RTDetrConvNormLayer", "RTDetrResNetConvLayer",
                                       "RTDetrResNetShortCut", "Sequential"}));
  EXPECT_GT(fold->at("params_before").get<int64_t>(), fold->at("params_after").get<int64_t>());
  ASSERT_NE(layout_entry(*on, "repvgg"), nullptr);
  ASSERT_NE(layout_entry(*on, "qkv_concat"), nullptr);
  EXPECT_EQ(layout_entry(*on, "channels_last"), nullptr);  // CPU: its predicate fails

  // serving.yaml turned the backbone's classes off: only the encoder's convolutions fold.
  const json* partial = model_entry(active, "rt_backbone_off");
  ASSERT_NE(partial, nullptr);
  ASSERT_EQ(partial->at("state"), "READY") << partial->dump();
  const json* partial_fold = layout_entry(*partial, "batchnorm_fold");
  ASSERT_NE(partial_fold, nullptr) << partial->dump();
  EXPECT_EQ(partial_fold->at("classes"), json({"RTDetrConvNormLayer", "Sequential"}));
  EXPECT_LT(partial_fold->at("modules_replaced").get<int64_t>(),
            fold->at("modules_replaced").get<int64_t>());

  // A hub layout cannot be honoured: the model is UNAVAILABLE with the reason.
  const json* hub = model_entry(active, "rt_hub");
  ASSERT_NE(hub, nullptr);
  EXPECT_EQ(hub->at("state"), "UNAVAILABLE");
  const std::string reason = hub->at("reason");
  EXPECT_NE(reason.find("kernel_config: RTDetrSelfAttention (" + repo.string() +
                        "/rt_hub/serving.yaml:3:3): 'acme/attn:Fused' cannot be loaded: the "
                        "pinned hub provider (kernels.lock) supplies kernel slot ops, not "
                        "layouts (use a built-in layout name or off)"),
            std::string::npos)
      << reason;
  remove_tree(repo);
}

TEST(ServerLayouts, ServingYamlKernelConfigErrorMakesTheModelUnavailable) {
  try {
    parse_serving_config("kernel_config:\n  RTDetrConvNormLayer: repvgg\n", "m/serving.yaml");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "m/serving.yaml:2:24: kernel_config: RTDetrConvNormLayer: layout repvgg does not "
                 "replace RTDetrConvNormLayer (it replaces RTDetrRepVggBlock, "
                 "RTDetrV2RepVggBlock, DFineRepVggBlock, PPDocLayoutV2RepVggBlock, "
                 "PPDocLayoutV3RepVggBlock, Deimv2RepVggBlock)");
  }
  const auto s = parse_serving_config("kernel_config:\n  ViTAttention: off\n", "m/serving.yaml");
  ASSERT_EQ(s.kernel_config.size(), 1u);
  EXPECT_EQ(s.kernel_config[0].value, "off");
  EXPECT_EQ(s.kernel_config[0].origin, "m/serving.yaml:2:3");
}

}  // namespace
}  // namespace libreyolo::server
