// Dynamic batching across requests of different image sizes for a padded family: two
// single-image requests to Deformable DETR (320x320 and 320x480 after the processor) run as ONE
// forward, padded to the larger size with a pixel_mask, and reproduce transformers' outputs for
// the same two images processed as one batch (the fixture).
#include <gtest/gtest.h>

#include <future>

#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

TEST(ServerBatching, DifferentSizesArePaddedIntoOneForwardLikeTransformers) {
  const std::string fixture = kFixtures + "/models/deformable_detr_tiny";
  const auto repo = temp_dir("ddetr_batching");
  add_fixture_model(repo, "ddetr", "deformable_detr_tiny",
                    "device: cpu\nmax_batch_size: 2\nmax_queue_delay_microseconds: 5000000\n"
                    "warmup: false\n");
  const auto config = loopback_config(repo);
  {
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    const std::string address = "127.0.0.1:" + std::to_string(daemon.grpc_port());
    const auto expected = models::core::SafetensorsFile::open(fixture + "/expected.safetensors");
    const auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU);
    const auto mask = expected->get("pixel_mask", at::kLong, at::kCPU);
    // The fixture README's exact normalisation, on each image's own (unpadded) region.
    const auto mean = at::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1}) * 255.0f;
    const auto std = at::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}) * 255.0f;
    const std::vector<std::array<int64_t, 2>> original = {{512, 512}, {400, 600}};
    std::vector<std::future<rpc::InferResult>> answers;
    std::vector<int64_t> heights, widths;
    for (int i = 0; i < 2; ++i) {
      const int64_t h = mask[i].select(1, 0).sum().item<int64_t>();
      const int64_t w = mask[i].select(0, 0).sum().item<int64_t>();
      heights.push_back(h);
      widths.push_back(w);
      const auto pv = ((u8[i].narrow(1, 0, h).narrow(2, 0, w) - mean) / std).contiguous();
      std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
      std::vector<int64_t> sizes = {original[i][0], original[i][1]};
      std::string raw_sizes(reinterpret_cast<const char*>(sizes.data()), 16);
      const std::string request =
          "model_name: \"ddetr\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, "
          "3, " +
          std::to_string(h) + ", " + std::to_string(w) +
          "] } inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] } "
          "parameters { key: \"threshold\" value { double_param: 0.3 } }";
      answers.push_back(std::async(std::launch::async, [address, request, raw, raw_sizes] {
        rpc::Client c(address);
        return c.infer(request, {raw, raw_sizes});
      }));
    }
    EXPECT_NE(heights[0] * 1000 + widths[0], heights[1] * 1000 + widths[1])
        << "the fixture's two images should differ in size";
    for (int i = 0; i < 2; ++i) {
      const auto r = answers[i].get();
      ASSERT_TRUE(r.ok()) << r.message;
      const std::string p = "th0.3_img" + std::to_string(i) + "_";
      const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      const auto el = expected->get(p + "labels", at::kLong, at::kCPU);
      const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      const auto count = values<int32_t>(r.output("num_detections").data).at(0);
      ASSERT_EQ(count, es.size(0)) << "image " << i;
      const auto scores = values<float>(r.output("scores").data);
      const auto labels = values<int64_t>(r.output("labels").data);
      const auto boxes = values<float>(r.output("boxes").data);
      double ds = 0, db = 0;
      for (int64_t j = 0; j < count; ++j) {
        ds = std::max(ds, std::abs(double(scores[j]) - es[j].item<float>()));
        EXPECT_EQ(labels[j], el[j].item<int64_t>()) << "image " << i << " detection " << j;
        for (int q = 0; q < 4; ++q)
          db = std::max(db, std::abs(double(boxes[j * 4 + q]) - eb[j][q].item<float>()));
      }
      std::cout << "image " << i << " (" << heights[i] << "x" << widths[i]
                << ", batched with the other): max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px" << std::endl;
      EXPECT_LE(ds, 1e-4);
      EXPECT_LE(db, 1e-2);
    }
    // One forward of 2 images, not two of 1.
    const auto metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_NE(metrics.find("libreyolo_batch_size_count{model=\"ddetr\"} 1"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("libreyolo_batch_size_sum{model=\"ddetr\"} 2"), std::string::npos);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
