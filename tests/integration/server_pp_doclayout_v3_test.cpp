// PP-DocLayoutV3 served end to end: the pp_doclayout_v3_tiny fixture folder in a model
// repository, the rendered document page (PNG) and the photograph (JPEG) in one gRPC request,
// decoded and resized by PPDocLayoutV3ImageProcessor (bicubic, no antialias), against
// transformers' post_process_object_detection of the same images (the fixture): detections in
// reading order (labels, scores, boxes in original pixels) and `reading_order` equal to upstream's
// order_seq; `masks` on request at the model's mask resolution; ModelMetadata's outputs.
#include <gtest/gtest.h>

#include "document_layout_serving.h"
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

TEST(ServerPPDocLayoutV3, ImagesAnsweredInReadingOrderAsTransformers) {
  const auto repo = temp_dir("pp_doclayout_v3_serving");
  add_fixture_model(repo, kName, kName, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    expect_served_layouts_match(c, kName);
    // masks on request: [2, K, 32, 32] (the 128x128 input's stride-4 masks), as the library's
    // post-processing of the fixture's outputs.
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + kName +
                                                              "/expected.safetensors");
    const auto m = c.infer(layout_images_request(kName, "0.5",
                                                 "outputs { name: \"masks\" } "
                                                 "outputs { name: \"reading_order\" }"),
                           {layout_images()});
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
