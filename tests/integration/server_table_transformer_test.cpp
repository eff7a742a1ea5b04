// Table Transformer served end to end: the table_transformer_tiny fixture folder in a model
// repository, the two photographs as encoded JPEGs in one request (decoded, resized and padded
// by DetrImageProcessor with a pixel_mask) and the rendered document page as a PNG, over gRPC
// with the project's client, against transformers' post_process_object_detection of the same
// images (the fixture): counts, labels in query order, scores and boxes in original pixels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

/// The elements of a BYTES tensor (each a 4-byte little-endian length, then its bytes).
std::vector<std::string> unpack(const std::string& raw) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at + 4 <= raw.size();) {
    uint32_t n = 0;
    std::memcpy(&n, raw.data() + at, 4);
    out.push_back(raw.substr(at + 4, n));
    at += 4 + n;
  }
  return out;
}

TEST(ServerTableTransformer, JpegsAndADocumentMatchTheFixturesPostProcessing) {
  const std::string fixture = "table_transformer_tiny";
  const auto repo = temp_dir("table_transformer_serving");
  add_fixture_model(repo, "tables", fixture, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + fixture +
                                                              "/expected.safetensors");
    auto compare = [&](const rpc::InferResult& r, const std::string& prefix, int result,
                       const std::string& what) {
      ASSERT_TRUE(r.ok()) << what << ": " << r.message;
      const auto es = expected->get(prefix + "scores", at::kFloat, at::kCPU);
      const auto el = expected->get(prefix + "labels", at::kLong, at::kCPU);
      const auto eb = expected->get(prefix + "boxes", at::kFloat, at::kCPU);
      const auto counts = values<int32_t>(r.output("num_detections").data);
      const int64_t k = r.output("scores").shape.at(1);
      const auto scores = values<float>(r.output("scores").data);
      const auto labels = values<int64_t>(r.output("labels").data);
      const auto boxes = values<float>(r.output("boxes").data);
      const auto names = unpack(r.output("label_names").data);
      ASSERT_EQ(counts.at(result), es.size(0)) << what;
      double ds = 0, db = 0;
      for (int64_t j = 0; j < es.size(0); ++j) {
        const int64_t row = result * k + j;
        ds = std::max(ds, std::abs(double(scores[row]) - es[j].item<float>()));
        EXPECT_EQ(labels[row], el[j].item<int64_t>()) << what << " detection " << j;
        EXPECT_EQ(names[row], el[j].item<int64_t>() == 0 ? "table" : "table rotated");
        for (int q = 0; q < 4; ++q)
          db = std::max(db, std::abs(double(boxes[row * 4 + q]) - eb[j][q].item<float>()));
      }
      std::cout << "[" << fixture << " " << what << "] " << es.size(0)
                << " detections, max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px\n";
      EXPECT_LE(ds, 1e-4) << what;
      EXPECT_LE(db, 1e-2) << what;
    };
    const auto jpegs = rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg"),
                                        read_file(kFixtures + "/images/coffee.jpg")});
    for (const std::string th : {"0.0", "0.3"}) {
      const auto r = c.infer(
          "model_name: \"tables\" inputs { name: \"images\" datatype: "
          "\"BYTES\" shape: 2 } parameters { key: \"threshold\" value { "
          "double_param: " +
              th + " } }",
          {jpegs});
      for (int i = 0; i < 2; ++i)
        compare(r, "th" + th + "_img" + std::to_string(i) + "_", i, "JPEG th " + th);
    }
    const auto page = rpc::pack_bytes({read_file(kFixtures + "/images/table_page.png")});
    const auto r = c.infer(
        "model_name: \"tables\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } "
        "parameters { key: \"threshold\" value { double_param: 0.3 } }",
        {page});
    compare(r, "doc_th0.3_img0_", 0, "document PNG");
    // The platform the model reports: its family's model_type.
    const auto meta = c.call("ModelMetadata", "name: \"tables\"");
    ASSERT_TRUE(meta.ok()) << meta.message;
    EXPECT_NE(meta.text.find("platform: \"libreyolo_table-transformer\""), std::string::npos)
        << meta.text;
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
