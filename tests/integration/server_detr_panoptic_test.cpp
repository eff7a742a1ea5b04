// DETR panoptic segmentation (DetrForSegmentation) served end to end: the detr_panoptic_tiny
// fixture folder in a model repository over gRPC with the project's client. The fixture's own
// pixels of image 1 (64x96) give the map and segments_info of the model and the post-processing
// run here; two JPEGs in one request give the outputs' layout (each image's map at its original
// size, -1 padding) and fusing, and the parameters' errors are named.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/panoptic.h"
#include "models/model.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

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

TEST(ServerDetrPanoptic, ServesTheSegmentationMapAndSegmentsInfo) {
  const std::string fixture = "detr_panoptic_tiny";
  const auto repo = temp_dir("detr_panoptic_serving");
  add_fixture_model(repo, "panoptic", fixture, "device: cpu\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + fixture +
                                                              "/expected.safetensors");
    // Image 1's pixels as the fixture stores them, the fixture's target size 40x60.
    const auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU);
    const auto mean = at::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1}) * 255.0f;
    const auto std = at::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}) * 255.0f;
    const auto pv = ((u8[1] - mean) / std).contiguous();
    const std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
    const std::vector<int64_t> size = {40, 60};
    const std::string raw_size(reinterpret_cast<const char*>(size.data()), 16);
    const auto r = c.infer(
        "model_name: \"panoptic\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: "
        "[1, 3, 64, 96] } inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] }",
        {raw, raw_size});
    ASSERT_TRUE(r.ok()) << r.message;
    ASSERT_EQ(r.outputs.size(), 3u);  // the defaults
    const auto& seg = r.output("segmentation");
    EXPECT_EQ(seg.datatype, "INT32");
    ASSERT_EQ(seg.shape, (std::vector<int64_t>{1, 40, 60}));
    const auto map = values<int32_t>(seg.data);
    // The same pixels through the model and image::post_process_panoptic_segmentation here
    // (whose parity with transformers is detr_panoptic_parity_test.cpp's): the served map and
    // segments_info are theirs exactly.
    c10::InferenceMode inference_mode;
    auto model = models::load_model(kFixtures + "/models/" + fixture);
    const auto out = model->forward(pv.unsqueeze(0));
    const auto ref =
        image::post_process_panoptic_segmentation(out.logits, out.pred_masks, {{40, 60}}, {})[0];
    const auto ref_map = ref.segmentation.contiguous();
    int64_t differ = 0;
    for (int64_t p = 0; p < 40 * 60; ++p) differ += map[p] != ref_map.data_ptr<int32_t>()[p];
    EXPECT_EQ(differ, 0) << "pixels whose segment id differs";
    EXPECT_GT(ref_map.gt(0).sum().item<int64_t>(), 0);  // some pixel has a segment
    const auto info = unpack(r.output("segments_info").data);
    ASSERT_EQ(info.size(), 1u);
    const auto j = nlohmann::json::parse(info[0]);
    ASSERT_EQ(j.size(), ref.segments.size());
    ASSERT_GE(j.size(), 1u);
    for (std::size_t q = 0; q < j.size(); ++q) {
      EXPECT_EQ(j[q]["id"], ref.segments[q].id);
      EXPECT_EQ(j[q]["label_id"], ref.segments[q].label_id);
      EXPECT_EQ(j[q]["label"], "LABEL_" + std::to_string(ref.segments[q].label_id));
      EXPECT_EQ(j[q]["was_fused"], false);
      EXPECT_DOUBLE_EQ(j[q]["score"].get<double>(), ref.segments[q].score);
    }
    EXPECT_EQ(values<int32_t>(r.output("num_segments").data),
              std::vector<int32_t>{static_cast<int32_t>(ref.segments.size())});

    // Two JPEGs (512x512 and 400x600): one map of the largest height and width, each image's
    // at its own size, -1 around it; the segment tensors and the detector's outputs on request.
    const auto jpegs = rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg"),
                                        read_file(kFixtures + "/images/coffee.jpg")});
    const auto both = c.infer(
        "model_name: \"panoptic\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 } "
        "parameters { key: \"label_ids_to_fuse\" value { string_param: \"1, 3\" } } "
        "outputs { name: \"segmentation\" } outputs { name: \"segments_info\" } "
        "outputs { name: \"segment_ids\" } outputs { name: \"segment_labels\" } "
        "outputs { name: \"segment_scores\" } outputs { name: \"scores\" }",
        {jpegs});
    ASSERT_TRUE(both.ok()) << both.message;
    const auto& m = both.output("segmentation");
    ASSERT_EQ(m.shape, (std::vector<int64_t>{2, 512, 600}));
    const auto maps = values<int32_t>(m.data);
    EXPECT_EQ(maps[0 * 512 * 600 + 10 * 600 + 550], -1);  // right of the 512x512 image
    EXPECT_EQ(maps[1 * 512 * 600 + 450 * 600 + 10], -1);  // below the 400x600 image
    EXPECT_GE(maps[1 * 512 * 600 + 200 * 600 + 300], 0);  // inside it
    const auto infos = unpack(both.output("segments_info").data);
    ASSERT_EQ(infos.size(), 2u);
    const int64_t s = both.output("segment_ids").shape.at(1);
    const auto ids = values<int32_t>(both.output("segment_ids").data);
    const auto labels = values<int64_t>(both.output("segment_labels").data);
    for (int i = 0; i < 2; ++i) {
      const auto ji = nlohmann::json::parse(infos[i]);
      for (std::size_t q = 0; q < ji.size(); ++q) {
        EXPECT_EQ(ji[q]["id"], ids[i * s + q]);
        EXPECT_EQ(ji[q]["label_id"], labels[i * s + q]);
        const int64_t label = ji[q]["label_id"];
        EXPECT_EQ(ji[q]["was_fused"], label == 1 || label == 3);
      }
    }
    EXPECT_EQ(both.output("scores").shape.at(0), 2);

    // Parameters and outputs it refuses, named.
    auto refused = [&](const std::string& extra) {
      return c.infer(
          "model_name: \"panoptic\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } " +
              extra,
          {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})});
    };
    auto bad = refused("parameters { key: \"label_ids_to_fuse\" value { string_param: \"1,x\" } }");
    EXPECT_EQ(bad.code, Code::invalid_argument);
    EXPECT_EQ(bad.message,
              "parameter 'label_ids_to_fuse' must be class ids separated by commas, got \"1,x\"");
    bad = refused(
        "parameters { key: \"overlap_mask_area_threshold\" value { string_param: "
        "\"high\" } }");
    EXPECT_EQ(bad.code, Code::invalid_argument);
    EXPECT_NE(bad.message.find("overlap_mask_area_threshold"), std::string::npos) << bad.message;
    bad = refused("outputs { name: \"masks\" }");
    EXPECT_EQ(bad.code, Code::invalid_argument);
    EXPECT_EQ(bad.message,
              "unknown output 'masks' (available: scores, labels, boxes, num_detections, "
              "label_names, logits, pred_boxes, segmentation, segments_info, num_segments, "
              "segment_ids, segment_labels, segment_scores)");
    // libreyolo-client detect --out: a panoptic model's segments painted over the photo; the
    // pixels it changed are exactly those of a segment (id > 0) in the served map.
    const std::string photo = kFixtures + "/images/coffee.jpg";
    const auto one =
        c.infer("model_name: \"panoptic\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
                {rpc::pack_bytes({read_file(photo)})});
    ASSERT_TRUE(one.ok()) << one.message;
    const auto served = values<int32_t>(one.output("segmentation").data);
    const auto dir = temp_dir("panoptic_overlay");
    const std::string png = (dir / "overlay.png").string(), log = (dir / "log.txt").string();
    const std::string cmd =
        std::string(LIBREYOLO_BINARY_DIR) +
        "/bin/libreyolo-client detect --model panoptic --image " + photo + " --out " + png +
        " --server 127.0.0.1:" + std::to_string(daemon.grpc_port()) + " > " + log + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
    const std::string printed = read_file(log);
    EXPECT_NE(printed.find("wrote " + png + " (panoptic segments over " + photo + ")"),
              std::string::npos)
        << printed;
    const std::string jpg = read_file(photo), painted = read_file(png);
    const auto before = image::decode_rgb(reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size());
    const auto after =
        image::decode_rgb(reinterpret_cast<const uint8_t*>(painted.data()), painted.size());
    ASSERT_EQ(after.height * after.width, static_cast<int64_t>(served.size()));
    int64_t changed_outside = 0, unchanged_inside = 0, inside = 0;
    for (int64_t p = 0; p < after.height * after.width; ++p) {
      const bool differs = before.rgb[p * 3] != after.rgb[p * 3] ||
                           before.rgb[p * 3 + 1] != after.rgb[p * 3 + 1] ||
                           before.rgb[p * 3 + 2] != after.rgb[p * 3 + 2];
      inside += served[p] > 0;
      changed_outside += differs && served[p] <= 0;
      unchanged_inside += !differs && served[p] > 0;
    }
    EXPECT_GT(inside, 0);
    EXPECT_EQ(changed_outside, 0);
    EXPECT_LT(unchanged_inside, inside / 10) << unchanged_inside << " of " << inside;
    remove_tree(dir);
    const auto active =
        nlohmann::json::parse(http_get(daemon.http_port(), "/active").body).at("models")[0];
    EXPECT_EQ(active.at("task"), "panoptic_segmentation");
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
