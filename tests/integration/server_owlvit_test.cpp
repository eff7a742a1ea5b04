// OWL-ViT / OWLv2 served end to end (server/tasks/prompted_detection_io.h): the owlvit_tiny and
// owlv2_tiny fixture folders (with their tokenizer files) in a model repository, the two
// photographs as JPEGs over gRPC with their prompts (one per image, as a JSON list and in
// Grounding DINO's "a. b." form), against transformers' post_process_grounded_object_detection
// of the same images (the fixture): counts, label texts, scores and boxes in original pixels.
// Then the contract's errors, each INVALID_ARGUMENT naming `text` or the parameter, and a
// truncated label reported in the `labels` output's parameters.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/tasks/prompted_detection_io.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

/// owlvit_tiny with the prompt cache (server/instance/prompt_cache.h; the default 64 MiB),
/// owlv2_tiny without.
void add_owl_model(const fs::path& repo, const std::string& fixture) {
  add_fixture_model(repo, fixture, fixture,
                    std::string("device: cpu\nwarmup: true\nmax_batch_size: 4\n") +
                        (fixture == "owlv2_tiny" ? "prompt_cache_mb: 0\n" : ""));
}

std::string infer_text(const std::string& model, int64_t images, const std::string& text_shape,
                       const std::string& extra = "") {
  return "model_name: \"" + model +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " + std::to_string(images) +
         " } inputs { name: \"text\" datatype: \"BYTES\" shape: " + text_shape + " } " + extra;
}

class ServerOwl : public ::testing::TestWithParam<const char*> {};

TEST_P(ServerOwl, PromptedJpegsMatchTheFixturesPostProcessing) {
  const std::string fixture = GetParam();
  const auto repo = temp_dir("owl_serving");
  add_owl_model(repo, fixture);
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected = models::core::SafetensorsFile::open(kFixtures + "/models/" + fixture +
                                                              "/expected.safetensors");
    const auto jpegs = rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg"),
                                        read_file(kFixtures + "/images/coffee.jpg")});
    // Image 0 as a JSON list, image 1 in Grounding DINO's form: the fixture's prompts.
    const auto text =
        rpc::pack_bytes({R"(["a photo of an astronaut", "a flag", "a cup of coffee"])",
                         "coffee. a saucer on a wooden table. a spoon."});
    const std::vector<std::vector<std::string>> prompts = {
        {"a photo of an astronaut", "a flag", "a cup of coffee"},
        {"coffee", "a saucer on a wooden table", "a spoon"}};
    const auto r = c.infer(infer_text(fixture, 2, "2",
                                      "parameters { key: \"box_threshold\" value { double_param: "
                                      "0.1 } }"),
                           {jpegs, text});
    ASSERT_TRUE(r.ok()) << r.message;
    const auto counts = values<int32_t>(r.output("num_detections").data);
    const int64_t k = r.output("scores").shape.at(1);
    const auto scores = values<float>(r.output("scores").data);
    const auto boxes = values<float>(r.output("boxes").data);
    const auto labels = rpc::unpack_bytes(r.output("labels").data);
    ASSERT_EQ(r.output("labels").datatype, "BYTES");
    ASSERT_EQ(labels.size(), static_cast<size_t>(2 * k));
    EXPECT_EQ(r.output("labels").parameters.count("truncated_labels"), 0u);
    for (int i = 0; i < 2; ++i) {
      const std::string p = "th0.1_img" + std::to_string(i) + "_";
      const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      const auto el = expected->get(p + "labels", at::kLong, at::kCPU);
      const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      ASSERT_EQ(counts.at(i), es.size(0)) << "image " << i;
      double ds = 0, db = 0;
      for (int64_t j = 0; j < counts[i]; ++j) {
        const int64_t row = i * k + j;
        ds = std::max(ds, std::abs(double(scores[row]) - es[j].item<float>()));
        EXPECT_EQ(labels[row], prompts[i][el[j].item<int64_t>()]) << "image " << i << " box " << j;
        for (int q = 0; q < 4; ++q)
          db = std::max(db, std::abs(double(boxes[row * 4 + q]) - eb[j][q].item<float>()));
      }
      std::cout << "[" << fixture << " image " << i << "] " << counts[i]
                << " detections, max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px\n";
      EXPECT_LE(ds, 1e-4);
      EXPECT_LE(db, 1e-2);  // our JPEG decode + processor against PIL + transformers'
    }
    // The same request again: owlvit_tiny's six labels come from its cache (the vision forward
    // only), the answer is the same; owlv2_tiny has no cache (prompt_cache_mb: 0).
    const auto again = c.infer(infer_text(fixture, 2, "2",
                                          "parameters { key: \"box_threshold\" value { "
                                          "double_param: 0.1 } }"),
                               {jpegs, text});
    ASSERT_TRUE(again.ok()) << again.message;
    EXPECT_EQ(again.output("scores").data, r.output("scores").data);
    EXPECT_EQ(again.output("boxes").data, r.output("boxes").data);
    EXPECT_EQ(again.output("labels").data, r.output("labels").data);
    const std::string metrics = http_get(daemon.http_port(), "/metrics").body;
    const std::string series =
        "{device=\"cpu\",instance=\"" + fixture + "_0\",model=\"" + fixture + "\"} ";
    if (fixture == "owlvit_tiny") {
      EXPECT_NE(metrics.find("libreyolo_prompt_cache_hits_total" + series + "6\n"),
                std::string::npos)
          << metrics;
      EXPECT_NE(metrics.find("libreyolo_prompt_cache_misses_total" + series + "6\n"),
                std::string::npos)
          << metrics;
    } else {
      EXPECT_EQ(metrics.find("libreyolo_prompt_cache_hits_total{"), std::string::npos);
    }
    // One prompt shared by the batch, and a label past the 14 tokens cut and reported.
    std::string long_label;
    for (int i = 0; i < 30; ++i) long_label += "cat ";
    const auto shared =
        c.infer(infer_text(fixture, 2, "1"), {jpegs, rpc::pack_bytes({"a dog. " + long_label})});
    ASSERT_TRUE(shared.ok()) << shared.message;
    const auto& lp = shared.output("labels").parameters;
    ASSERT_EQ(lp.count("truncated_labels"), 1u);
    EXPECT_EQ(std::get<std::string>(lp.at("truncated_labels")), "0:1,1:1");
    EXPECT_EQ(std::get<int64_t>(lp.at("max_text_tokens")), 16);
    // The contract's refusals: INVALID_ARGUMENT naming the field.
    auto refused = [&](const std::string& request, const std::vector<std::string>& raw,
                       const std::string& message) {
      const auto e = c.infer(request, raw);
      EXPECT_EQ(e.code, api::Code::invalid_argument) << message;
      EXPECT_NE(e.message.find(message), std::string::npos) << e.message;
    };
    const auto one = rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg")});
    refused(
        "model_name: \"" + fixture + "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
        {one}, "input 'text' is required by an open-vocabulary detector");
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({" . . "})},
            "input 'text': prompt 0 has no label");
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({std::string("a \xff cat")})},
            "input 'text': element 0 is not UTF-8 (text: invalid UTF-8 at byte 2)");
    std::string many;
    for (int i = 0; i < 10000; ++i) many += "x.";
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({many})},
            "input 'text': prompt 0 has 10000 labels, more than the 256 this model takes");
    refused(infer_text(fixture, 1, "3"), {one, rpc::pack_bytes({"a", "b", "c"})},
            "input 'text': shape [3], expected [1], [1], [1,L] or [1,L]");
    refused(infer_text(fixture, 1, "1",
                       "parameters { key: \"text_threshold\" value { double_param: 0.3 } }"),
            {one, rpc::pack_bytes({"a cat"})}, "parameter 'text_threshold': model_type");
    // OmDet-Turbo's own parameters, refused as text_threshold is.
    const std::string model_type = fixture == "owlv2_tiny" ? "owlv2" : "owlvit";
    refused(infer_text(fixture, 1, "1",
                       "parameters { key: \"task\" value { string_param: \"Find a cat.\" } }"),
            {one, rpc::pack_bytes({"a cat"})},
            "parameter 'task': model_type " + model_type +
                " takes no task sentence (omdet-turbo only)");
    refused(infer_text(fixture, 1, "1",
                       "parameters { key: \"nms_threshold\" value { double_param: 0.3 } }"),
            {one, rpc::pack_bytes({"a cat"})},
            "parameter 'nms_threshold': model_type " + model_type +
                " has no NMS threshold (omdet-turbo only)");
    if (fixture == "owlvit_tiny") {
      // libreyolo-client detect --prompt --out: the boxes printed with their phrases and drawn
      // captioned (white 6x10 text on the box colour: more pure-white pixels than the photo).
      const std::string photo = kFixtures + "/images/astronaut.jpg";
      const auto dir = temp_dir("owl_overlay");
      const std::string png = (dir / "overlay.png").string(), log = (dir / "log.txt").string();
      const std::string cmd =
          std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-client detect --model " + fixture +
          " --image " + photo +
          " --prompt 'a photo of an astronaut. a flag. a cup of coffee.' --threshold 0.1 --out " +
          png + " --server 127.0.0.1:" + std::to_string(daemon.grpc_port()) + " > " + log + " 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
      const std::string printed = read_file(log);
      EXPECT_NE(printed.find(photo + ": " + std::to_string(counts[0]) + " detections"),
                std::string::npos)
          << printed;
      EXPECT_NE(printed.find("  a photo of an astronaut  "), std::string::npos) << printed;
      EXPECT_NE(printed.find("wrote " + png + " (" + std::to_string(counts[0]) +
                             " captioned boxes over " + photo + ")"),
                std::string::npos)
          << printed;
      const std::string jpg = read_file(photo), painted = read_file(png);
      const auto before =
          image::decode_rgb(reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size());
      const auto after =
          image::decode_rgb(reinterpret_cast<const uint8_t*>(painted.data()), painted.size());
      auto white = [](const image::RgbImage& im) {
        int64_t n = 0;
        for (size_t p = 0; p + 2 < im.rgb.size(); p += 3)
          n += im.rgb[p] == 255 && im.rgb[p + 1] == 255 && im.rgb[p + 2] == 255;
        return n;
      };
      EXPECT_GT(white(after), white(before) + 100);
      remove_tree(dir);
    }
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

TEST(PromptLabels, GroundingDinoFormAndJsonLists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(prompt_labels("a cat. a remote control.", 0), (V{"a cat", "a remote control"}));
  EXPECT_EQ(prompt_labels("  a cat .. a dog  ", 0), (V{"a cat", "a dog"}));
  EXPECT_EQ(prompt_labels("a cat", 0), (V{"a cat"}));
  EXPECT_EQ(prompt_labels(" . . ", 0), V{});
  EXPECT_EQ(prompt_labels(R"( ["Dr. Pepper", " a can ", ""])", 0), (V{"Dr. Pepper", "a can"}));
  auto message = [](std::string_view text) -> std::string {
    try {
      prompt_labels(text, 3);
    } catch (const api::Error& e) {
      EXPECT_EQ(e.code(), api::Code::invalid_argument);
      return e.what();
    }
    return "(parsed)";
  };
  EXPECT_EQ(message("[\"a\", 1]"), "input 'text': element 3: label 1 is not a string");
  EXPECT_EQ(message("[a cat"),
            "input 'text': element 3: starts with '[' but is not a JSON array of strings");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServerOwl, ::testing::Values("owlvit_tiny", "owlv2_tiny"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo::server
