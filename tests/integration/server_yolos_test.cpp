// YOLOS under dynamic batching: the family takes no pixel_mask, so its outputs depend on the
// padding, as upstream, and dynamic batching never pads a request into another size's batch.
// (YOLOS against the fixtures over gRPC: server_detr_lineage_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <future>

#include "models/core/safetensors.h"
#include "served_detections.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

// Dynamic batching never pads a YOLOS request into a larger batch: the family takes no
// pixel_mask (models::Family::pixel_mask), so the padding would reach its encoder and change the
// detections. Each photograph alone, then both at once within the queue delay (different sizes
// after YolosImageProcessor: 112x112 and 96x160, which one padded 112x160 forward would hold):
// the concurrent answers equal the lone ones exactly, and the model ran four forwards of one
// image (before the fix: three, one of them the padded pair, and different scores and boxes).
TEST(ServerYolosBatching, DifferentSizesNeverShareAForward) {
  const auto repo = temp_dir("yolos_batching");
  add_fixture_model(repo, "yolos", "yolos_tiny",
                    "device: cpu\nwarmup: false\nmax_batch_size: 2\n"
                    "max_queue_delay_microseconds: 500000\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    const std::string address = "127.0.0.1:" + std::to_string(daemon.grpc_port());
    const std::vector<std::string> images = {"astronaut.jpg", "coffee.jpg"};
    auto infer = [&](const std::string& image) {
      rpc::Client c(address, 64 << 20);
      return c.infer(
          "model_name: \"yolos\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } "
          "parameters { key: \"threshold\" value { double_param: 0.0 } }",
          {rpc::pack_bytes({read_file(kFixtures + "/images/" + image)})});
    };
    std::vector<rpc::InferResult> alone;
    for (const auto& image : images) alone.push_back(infer(image));
    std::vector<std::future<rpc::InferResult>> pending;
    for (const auto& image : images)
      pending.push_back(std::async(std::launch::async, infer, image));
    for (size_t i = 0; i < images.size(); ++i) {
      const auto together = pending[i].get();
      ASSERT_TRUE(alone[i].ok()) << images[i] << ": " << alone[i].message;
      ASSERT_TRUE(together.ok()) << images[i] << ": " << together.message;
      const auto a = detections(alone[i], 0);
      const auto t = detections(together, 0);
      // Threshold 0: every one of the fixture's 10 detection tokens (meta.json counts).
      ASSERT_EQ(a.size(), 10u) << images[i];
      ASSERT_EQ(t.size(), a.size()) << images[i];
      for (size_t j = 0; j < a.size(); ++j) {
        EXPECT_EQ(t[j].score, a[j].score) << images[i] << " detection " << j;
        EXPECT_EQ(t[j].label, a[j].label) << images[i] << " detection " << j;
        for (int q = 0; q < 4; ++q)
          EXPECT_EQ(t[j].box[q], a[j].box[q]) << images[i] << " detection " << j << " box " << q;
      }
    }
    const auto metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_NE(metrics.find("libreyolo_batch_size_count{model=\"yolos\"} 4"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("libreyolo_batch_size_sum{model=\"yolos\"} 4"), std::string::npos);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
