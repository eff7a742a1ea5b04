// The DETR lineage served end to end, one test for the families whose processors resize and
// pad the same way (DETR, Conditional DETR, DAB-DETR, YOLOS): each fixture folder in a model
// repository, the two photographs as encoded JPEGs in one request (decoded, resized and padded
// by the family's image processor) over gRPC with the project's client, against transformers'
// post_process_object_detection of the same images (the fixture): counts, labels in the
// family's order, scores and boxes in original pixels. The fixture's own pixels of image 1 as
// pixel_values check the model alone; top_k keeps the best detections, best first.
//   detr_tiny / detr_tiny_timm       transformers' / timm's ResNet (facebook/detr-resnet-50's
//                                    layout and config.json form), queries in query order
//   conditional_detr_tiny            timm's ResNet in microsoft/conditional-detr-resnet-50's form;
//   dab_detr_tiny                    model_type "dab-detr": the top 100 of queries x classes,
//                                    best first
//   yolos_tiny / yolos_tiny_mid      YolosImageProcessor (sides multiples of 16) and the legacy
//                                    YolosFeatureExtractor file with mid-position embeddings; no
//                                    pixel_mask, so image 1's pixels are the batch's padded ones
//                                    (dynamic batching never pads YOLOS: server_yolos_test.cpp)
#include <gtest/gtest.h>

#include <algorithm>

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

/// How top_k's answer relates to the fixture's threshold-0 detections of image 1.
enum class TopK {
  sorted,  ///< one detection per query, in query order: top_k is the best scores, sorted
  stored,  ///< already the best query-class pairs, best first: top_k is the first k
  none,    ///< not checked (YOLOS: its fixture's detections are per detection token)
};

struct LineageCase {
  const char* fixture;
  int64_t height, width;  ///< image 1's pixel_values: the fixture's pixel_u8 size
  bool padded;            ///< image 1 is padded in pixel_u8 (its pixel_mask zeroes the padding)
  TopK top_k;
};

void PrintTo(const LineageCase& c, std::ostream* os) { *os << c.fixture; }

class ServedDetrLineage : public ::testing::TestWithParam<LineageCase> {};

TEST_P(ServedDetrLineage, JpegsAndPixelsMatchTheFixturesPostProcessing) {
  const LineageCase& lc = GetParam();
  const std::string fixture = lc.fixture;
  const auto repo = temp_dir(fixture + "_serving");
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
    // Two JPEGs in one request, through our decode + the family's processor (resize, pad, mask):
    // DETR measured within 1.2e-6 of transformers' scores and 1e-4 px of its boxes.
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
    // The fixture's pixels of image 1 with its target size: the model alone, held to the parity
    // bars.
    const auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU);
    ASSERT_EQ(u8.size(2), lc.height);
    ASSERT_EQ(u8.size(3), lc.width);
    const auto mean = at::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1}) * 255.0f;
    const auto std = at::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}) * 255.0f;
    at::Tensor pv = (u8[1] - mean) / std;
    if (lc.padded) pv = pv * expected->get("pixel_mask", at::kFloat, at::kCPU)[1];
    pv = pv.contiguous();
    std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
    const std::vector<int64_t> size = {400, 600};
    std::string raw_size(reinterpret_cast<const char*>(size.data()), 16);
    const std::string pixels_request =
        "model_name: \"" + fixture + "\" inputs { name: \"pixel_values\" datatype: \"FP32\" " +
        "shape: [1, 3, " + std::to_string(lc.height) + ", " + std::to_string(lc.width) +
        "] } inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] } "
        "parameters { key: \"threshold\" value { double_param: 0.0 } }";
    compare(c.infer(pixels_request, {raw, raw_size}), "0.0", 1, 0, 1e-5, 1e-2, "pixel_values");
    if (lc.top_k != TopK::none) {
      // top_k 3: the three best detections, best first.
      const auto top =
          c.infer(pixels_request + " parameters { key: \"top_k\" value { int64_param: 3 } }",
                  {raw, raw_size});
      ASSERT_TRUE(top.ok()) << top.message;
      const auto best = detections(top, 0);
      ASSERT_EQ(best.size(), 3u);
      const auto all = expected->get("th0.0_img1_scores", at::kFloat, at::kCPU);
      const auto labels = expected->get("th0.0_img1_labels", at::kLong, at::kCPU);
      const auto order = lc.top_k == TopK::sorted ? std::get<1>(all.sort(0, /*descending=*/true))
                                                  : at::arange(all.size(0));
      for (int j = 0; j < 3; ++j) {
        const int64_t k = order[j].item<int64_t>();
        EXPECT_NEAR(best[j].score, all[k].item<float>(), 1e-5) << j;
        EXPECT_EQ(best[j].label, labels[k].item<int64_t>()) << j;
      }
    }
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ServedDetrLineage,
    ::testing::Values(LineageCase{"detr_tiny", 160, 240, false, TopK::sorted},
                      LineageCase{"detr_tiny_timm", 160, 240, false, TopK::sorted},
                      LineageCase{"conditional_detr_tiny", 96, 144, false, TopK::stored},
                      LineageCase{"dab_detr_tiny", 96, 144, false, TopK::stored},
                      LineageCase{"yolos_tiny", 112, 160, true, TopK::none},
                      LineageCase{"yolos_tiny_mid", 112, 160, true, TopK::none}),
    [](const auto& info) { return std::string(info.param.fixture); });

}  // namespace
}  // namespace libreyolo::server
