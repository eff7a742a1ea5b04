// YOLOS served end to end: the yolos_tiny (5.17 YolosImageProcessor file) and yolos_tiny_mid
// (mid-position embeddings, the Hub's legacy YolosFeatureExtractor file) fixture folders in a
// model repository, the two photographs as encoded JPEGs in one request (decoded, resized to
// multiples of 16 by YolosImageProcessor and padded into one 112x160 batch, as transformers'
// batch) over gRPC with the project's client, against transformers' post_process_object_detection
// of the same images (the fixture): counts, labels in detection-token order, scores and boxes in
// original pixels. The fixture's own padded pixels of image 1 as pixel_values check the model
// alone. YOLOS takes no pixel_mask, so its outputs depend on the padding, as upstream: the
// comparison holds for the same batch, and dynamic batching never pads a request into another
// size's batch (ServerYolosBatching).
#include <gtest/gtest.h>

#include <algorithm>
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

struct Detection {
  float score;
  int64_t label;
  std::array<float, 4> box;
};

/// Detections of image `i` of a detector's response (num_detections of them, rows padded to
/// the response's second dimension).
std::vector<Detection> detections(const rpc::InferResult& r, int i) {
  const auto counts = values<int32_t>(r.output("num_detections").data);
  const int64_t k = r.output("scores").shape.at(1);
  const auto scores = values<float>(r.output("scores").data);
  const auto labels = values<int64_t>(r.output("labels").data);
  const auto boxes = values<float>(r.output("boxes").data);
  std::vector<Detection> out;
  for (int64_t j = 0; j < counts.at(i); ++j) {
    const int64_t row = i * k + j;
    out.push_back({scores[row],
                   labels[row],
                   {boxes[row * 4], boxes[row * 4 + 1], boxes[row * 4 + 2], boxes[row * 4 + 3]}});
  }
  return out;
}

class ServerYolos : public ::testing::TestWithParam<const char*> {};

TEST_P(ServerYolos, JpegsAndPixelsMatchTheFixturesPostProcessing) {
  const std::string fixture = GetParam();
  const auto repo = temp_dir("yolos_serving");
  add_fixture_model(repo, fixture, fixture, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + fixture +
                                                              "/expected.safetensors");
    auto compare = [&](const rpc::InferResult& r, const std::string& th, int image, int result,
                       double score_tol, double box_tol, const std::string& what) {
      ASSERT_TRUE(r.ok()) << what << ": " << r.message;
      const std::string p = "th" + th + "_img" + std::to_string(image) + "_";
      const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      const auto el = expected->get(p + "labels", at::kLong, at::kCPU);
      const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      const auto got = detections(r, result);
      ASSERT_EQ(static_cast<int64_t>(got.size()), es.size(0)) << what << " image " << image;
      double ds = 0, db = 0;
      for (size_t j = 0; j < got.size(); ++j) {
        ds = std::max(ds, std::abs(double(got[j].score) - es[j].item<float>()));
        EXPECT_EQ(got[j].label, el[j].item<int64_t>()) << what << " detection " << j;
        for (int q = 0; q < 4; ++q)
          db = std::max(db, std::abs(double(got[j].box[q]) - eb[j][q].item<float>()));
      }
      std::cout << "[" << fixture << " " << what << " th " << th << " image " << image << "] "
                << got.size() << " detections, max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px\n";
      EXPECT_LE(ds, score_tol) << what;
      EXPECT_LE(db, box_tol) << what;
    };
    // Two JPEGs in one request, through our decode + YolosImageProcessor + the instance's
    // padding: transformers' batch.
    const auto jpegs = rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg"),
                                        read_file(kFixtures + "/images/coffee.jpg")});
    for (const std::string th : {"0.0", "0.3"}) {
      const auto r = c.infer("model_name: \"" + fixture +
                                 "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 } "
                                 "parameters { key: \"threshold\" value { double_param: " +
                                 th + " } }",
                             {jpegs});
      for (int i = 0; i < 2; ++i) compare(r, th, i, i, 1e-4, 1e-2, "JPEG");
    }
    // The fixture's pixels of image 1 (96x160 resized, padded to the batch's 112x160) with its
    // target size: the model alone, held to the parity bars.
    const auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU);
    const auto valid = expected->get("pixel_mask", at::kFloat, at::kCPU)[1];
    const auto mean = at::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1}) * 255.0f;
    const auto std = at::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}) * 255.0f;
    const auto pv = (((u8[1] - mean) / std) * valid).contiguous();
    ASSERT_EQ(valid.sum().item<float>(), 96.0f * 160.0f);
    std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
    const std::vector<int64_t> size = {400, 600};
    std::string raw_size(reinterpret_cast<const char*>(size.data()), 16);
    const auto r = c.infer(
        "model_name: \"" + fixture +
            "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 112, 160] } "
            "inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] } "
            "parameters { key: \"threshold\" value { double_param: 0.0 } }",
        {raw, raw_size});
    compare(r, "0.0", 1, 0, 1e-5, 1e-2, "pixel_values");
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

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

INSTANTIATE_TEST_SUITE_P(Fixtures, ServerYolos, ::testing::Values("yolos_tiny", "yolos_tiny_mid"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo::server
