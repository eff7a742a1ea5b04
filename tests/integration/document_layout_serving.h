// gRPC checks shared by the document-layout serving tests (server_pp_doclayout_v2_test.cpp,
// server_pp_doclayout_v3_test.cpp): the fixture's rendered page (PNG) and photograph (JPEG) in
// one request, answered as transformers' post_process_object_detection of the same images (the
// fixture folder's expected.safetensors and meta.json).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server::testing {

/// ModelInfer text for model `name`: the two images as `images` (BYTES [2]), parameter
/// `threshold`, then `extra` (requested outputs).
inline std::string layout_images_request(const std::string& name, const std::string& threshold,
                                         const std::string& extra = "") {
  return "model_name: \"" + name +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 } "
         "parameters { key: \"threshold\" value { double_param: " +
         threshold + " } } " + extra;
}

/// The page PNG and the photograph JPEG, packed as the `images` input.
inline std::string layout_images() {
  const std::string images = std::string(LIBREYOLO_TEST_FIXTURES) + "/images/";
  return rpc::pack_bytes(
      {read_file(images + "document_page.png"), read_file(images + "coffee.jpg")});
}

/// At each threshold of the fixture `name` (tests/fixtures/models/<name>/meta.json), the served
/// detections (default outputs + `reading_order`) equal upstream's: counts, reading order and
/// labels exactly, scores within 1e-4, boxes within 1e-2 px; `reading_order` is [2, K] with -1
/// after each image's detections. Expects the fixture's two thresholds.
inline void expect_served_layouts_match(rpc::Client& c, const std::string& name) {
  const std::string dir = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/" + name;
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto meta = models::core::read_json_file(dir + "/meta.json");
  const auto images = layout_images();
  int thresholds = 0;
  for (const auto& [key, entry] : meta.at("postprocess").items()) {
    if (key.substr(key.size() - 5) != "_img0") continue;
    ++thresholds;
    const std::string th = key.substr(2, key.size() - 7);  // "th<threshold>_img0"
    const auto r = c.infer(layout_images_request(name, th), {images});
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
}

}  // namespace libreyolo::server::testing
