// Kernels bound per model: a serving.yaml `kernels:` section narrows the server's lists for that
// model only (/active `bindings`), and a name the registry does not know fails that model's load
// with the key and the known names, while the other models serve.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/app/daemon.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

TEST(ServerKernels, AModelsServingYamlNarrowsItsOwnSlots) {
  const auto repo = temp_dir("kernels_per_model");
  add_fixture_model(repo, "vit_default", "vit_tiny", "fused_attention: on\n");
  add_fixture_model(
      repo, "vit_reference", "vit_tiny",
      "fused_attention: on\nkernels:\n  slots:\n    attention: {allow: [reference]}\n");
  add_fixture_model(repo, "vit_typo", "vit_tiny",
                    "kernels:\n  slots:\n    attention: {allow: [sdpa, cdua]}\n");
  Daemon d(loopback_config(repo), fake_or_real());
  d.start();
  const auto active = nlohmann::json::parse(http_get(d.http_port(), "/active").body);
  const auto& b = active["bindings"];
  ASSERT_TRUE(b.contains("vit_default")) << active.dump(1);
  ASSERT_TRUE(b.contains("vit_reference")) << active.dump(1);
  EXPECT_FALSE(b.contains("vit_typo"));
  // The same checkpoint: SDPA for one model, the reference math for the other.
  EXPECT_EQ(b["vit_default"]["attention"]["selected"], "sdpa");
  EXPECT_EQ(b["vit_reference"]["attention"]["selected"], "reference");
  bool sdpa_excluded = false;
  for (const auto& c : b["vit_reference"]["attention"]["candidates"]) {
    if (c["name"] != "sdpa") continue;
    sdpa_excluded = true;
    EXPECT_EQ(c["reason"], "excluded by the model's policy");
  }
  EXPECT_TRUE(sdpa_excluded);
  std::string typo_reason;
  for (const auto& m : active["models"])
    if (m["name"] == "vit_typo") typo_reason = m["reason"];
  EXPECT_EQ(typo_reason,
            (repo / "vit_typo" / "serving.yaml").string() +
                ":3:5: kernels.slots.attention.allow: unknown implementation 'cdua' "
                "(known: cpu, cuda, hub, mem_efficient, nvjpeg, onednn, reference, sdpa, winograd)")
      << active.dump(1);
  // Both good models answer; calls are counted per model.
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  const std::string jpeg = read_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/coffee.jpg");
  for (const std::string model : {"vit_default", "vit_reference"}) {
    auto r = c.infer(
        "model_name: \"" + model + "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
        {rpc::pack_bytes({jpeg})});
    EXPECT_TRUE(r.ok()) << model << ": " << r.message;
  }
  const auto after = nlohmann::json::parse(http_get(d.http_port(), "/active").body);
  EXPECT_GT(after["bindings"]["vit_default"]["attention"]["candidates"][0]["calls"].get<int>(), 0);
  EXPECT_GT(after["bindings"]["vit_reference"]["attention"]["candidates"][0]["calls"].get<int>(),
            0);
}

}  // namespace
}  // namespace libreyolo::server
