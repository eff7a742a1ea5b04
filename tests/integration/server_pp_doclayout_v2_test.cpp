// PP-DocLayoutV2 served end to end: the pp_doclayout_v2_tiny fixture folder in a model
// repository, the rendered document page (PNG) and the photograph (JPEG) in one gRPC request,
// decoded and resized by PPDocLayoutV2ImageProcessor, against transformers'
// post_process_object_detection of the same images (the fixture): detections in reading order
// (labels, scores, boxes in original pixels) and `reading_order` equal to upstream's order_seq.
// The family has no masks: ModelMetadata lists none and asking for them is INVALID_ARGUMENT.
#include <gtest/gtest.h>

#include "document_layout_serving.h"
#include "server/app/daemon.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kName = "pp_doclayout_v2_tiny";

TEST(ServerPPDocLayoutV2, ImagesAnsweredInReadingOrderAsTransformers) {
  const auto repo = temp_dir("pp_doclayout_v2_serving");
  add_fixture_model(repo, kName, kName, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    expect_served_layouts_match(c, kName);
    // No masks in this family: an unknown output, named with what is available.
    const auto m = c.infer(layout_images_request(kName, "0.5", "outputs { name: \"masks\" }"),
                           {layout_images()});
    EXPECT_EQ(m.code, api::Code::invalid_argument);
    EXPECT_EQ(m.message,
              "unknown output 'masks' (available: scores, labels, boxes, num_detections, "
              "label_names, logits, pred_boxes, reading_order)");
    const auto md = c.call("ModelMetadata", "name: \"" + kName + "\"");
    ASSERT_TRUE(md.ok()) << md.message;
    EXPECT_NE(md.text.find("name: \"reading_order\"\n  datatype: \"INT64\"\n  shape: -1\n  shape: "
                           "-1\n"),
              std::string::npos)
        << md.text;
    EXPECT_NE(md.text.find("name: \"logits\"\n  datatype: \"FP32\"\n  shape: -1\n  shape: 24\n  "
                           "shape: 5\n"),
              std::string::npos)
        << md.text;
    for (const char* absent : {"masks", "rle_counts", "rle_size"})
      EXPECT_EQ(md.text.find(absent), std::string::npos) << absent << "\n" << md.text;
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
