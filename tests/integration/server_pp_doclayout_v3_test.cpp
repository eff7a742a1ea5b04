// PP-DocLayoutV3 served end to end: the pp_doclayout_v3_tiny fixture folder in a model
// repository, the rendered document page (PNG) and the photograph (JPEG) in one gRPC request,
// decoded and resized by PPDocLayoutV3ImageProcessor (bicubic, no antialias), against
// transformers' post_process_object_detection of the same images (the fixture): detections in
// reading order (labels, scores, boxes in original pixels) and `reading_order` equal to upstream's
// order_seq; `masks` on request at the model's mask resolution; ModelMetadata's outputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/image/document_layout.h"
#include "server/app/daemon.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;
const std::string kName = "pp_doclayout_v3_tiny";

std::string images_request(const std::string& threshold, const std::string& extra = "") {
  return "model_name: \"" + kName +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 } "
         "parameters { key: \"threshold\" value { double_param: " +
         threshold + " } } " + extra;
}

TEST(ServerPPDocLayoutV3, ImagesAnsweredInReadingOrderAsTransformers) {
  const auto repo = temp_dir("pp_doclayout_v3_serving");
  add_fixture_model(repo, kName, kName, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + kName +
                                                              "/expected.safetensors");
    const auto meta = models::core::read_json_file(kFixtures + "/models/" + kName + "/meta.json");
    const auto images = rpc::pack_bytes({read_file(kFixtures + "/images/document_page.png"),
                                         read_file(kFixtures + "/images/coffee.jpg")});
    int thresholds = 0;
    for (const auto& [key, entry] : meta.at("postprocess").items()) {
      if (key.substr(key.size() - 5) != "_img0") continue;
      ++thresholds;
      const std::string th = key.substr(2, key.size() - 7);  // "th<threshold>_img0"
      const auto r = c.infer(images_request(th), {images});
      ASSERT_TRUE(r.ok()) << r.message;
      const auto counts = values<int32_t>(r.output("num_detections").data);
      const int64_t k = r.output("scores").shape.at(1);
      EXPECT_EQ(r.output("reading_order").shape, (std::vector<int64_t>{2, k}));
      const auto scores = values<float>(r.output("scores").data);
      const auto labels = values<int64_t>(r.output("labels").data);
      const auto boxes = values<float>(r.output("boxes").data);
      const auto order = values<int64_t>(r.output("reading_order").data);
      for (int i = 0; i < 2; ++i) {
        const std::string p = "th" + th + "_img" + std::to_string(i) + "_";
        const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
        const auto el = expected->get(p + "labels", at::kLong, at::kCPU);
        const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
        const auto eo = expected->get(p + "order_seq", at::kLong, at::kCPU);
        ASSERT_EQ(counts.at(i), es.size(0)) << p;
        for (int64_t j = 0; j < es.size(0); ++j) {
          const int64_t row = i * k + j;
          EXPECT_EQ(order[row], eo[j].item<int64_t>()) << p << j;
          EXPECT_EQ(labels[row], el[j].item<int64_t>()) << p << j;
          EXPECT_NEAR(scores[row], es[j].item<float>(), 1e-4) << p << j;
          for (int q = 0; q < 4; ++q) EXPECT_NEAR(boxes[row * 4 + q], eb[j][q].item<float>(), 1e-2);
        }
        for (int64_t j = es.size(0); j < k; ++j) EXPECT_EQ(order[i * k + j], -1);
      }
    }
    EXPECT_EQ(thresholds, 2);
    // masks on request: [2, K, 32, 32] (the 128x128 input's stride-4 masks), as the library's
    // post-processing of the fixture's outputs.
    const auto m = c.infer(images_request("0.5",
                                          "outputs { name: \"masks\" } "
                                          "outputs { name: \"reading_order\" }"),
                           {images});
    ASSERT_TRUE(m.ok()) << m.message;
    const auto& masks = m.output("masks");
    EXPECT_EQ(masks.datatype, "UINT8");
    EXPECT_EQ(masks.shape, (std::vector<int64_t>{2, 12, 32, 32}));
    const auto pages = image::post_process_document_layout(
        expected->view("logits"), expected->view("pred_boxes"), expected->view("order_logits"),
        expected->view("out_masks"), {}, 0.5);
    const at::Tensor want = pages[1].masks.to(at::kByte).contiguous();
    EXPECT_EQ(masks.data.substr(12 * 32 * 32),
              std::string(reinterpret_cast<const char*>(want.data_ptr<uint8_t>()), 12 * 32 * 32));
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
