// OmDet-Turbo served end to end through the open-vocabulary contract
// (server/tasks/prompted_detection_io.h): the omdet_turbo_tiny fixture folder (with its CLIP
// tokenizer files) in a model repository, the fixture's "batch" photographs as JPEGs over gRPC
// with their classes (the processor's default task "Detect a, b."), against transformers'
// post_process_grounded_object_detection of the same images at the fixture's threshold and
// nms_threshold 0.5: counts, class texts (the `labels` output), class indices (`label_ids`),
// scores and boxes in original pixels. Then the contract's refusals, worded as for the other
// open-vocabulary families (an empty prompt, 10,000 labels, text that is not UTF-8).
#include <gtest/gtest.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

std::string infer_text(const std::string& model, int64_t images, const std::string& text_shape,
                       const std::string& extra = "") {
  return "model_name: \"" + model +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " + std::to_string(images) +
         " } inputs { name: \"text\" datatype: \"BYTES\" shape: " + text_shape + " } " + extra;
}

TEST(ServerOmDetTurbo, PromptedJpegsMatchTheFixturesPostProcessing) {
  const std::string fixture = "omdet_turbo_tiny";
  const auto repo = temp_dir("omdet_turbo_serving");
  add_fixture_model(repo, fixture, fixture, "device: cpu\nwarmup: true\nmax_batch_size: 4\n");
  const fs::path src = fs::path(kFixtures) / "models" / fixture;
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected =
        models::core::SafetensorsFile::open((src / "expected.safetensors").string());
    const auto meta = nlohmann::json::parse(read_file((src / "meta.json").string()));
    const auto& cm = meta.at("cases").at("batch");
    // One prompt per image: "a. b." form and a JSON list (the processor's classes as given).
    std::vector<std::string> raw,
        text = {"person. flag. cup.", R"(["cup", "spoon", "table", "a saucer"])"};
    for (const auto& im : cm.at("images"))
      raw.push_back(read_file(kFixtures + "/images/" + im.get<std::string>()));
    const double threshold = cm.at("threshold");
    const auto r = c.infer(
        infer_text(fixture, 2, "2",
                   c10::str("parameters { key: \"threshold\" value { double_param: ", threshold,
                            " } } outputs { name: \"labels\" } outputs { "
                            "name: \"label_ids\" } outputs { name: \"scores\" "
                            "} outputs { name: \"boxes\" } outputs { name: "
                            "\"num_detections\" }")),
        {rpc::pack_bytes(raw), rpc::pack_bytes(text)});
    ASSERT_TRUE(r.ok()) << r.message;
    const auto counts = values<int32_t>(r.output("num_detections").data);
    const int64_t k = r.output("scores").shape.at(1);
    const auto scores = values<float>(r.output("scores").data);
    const auto boxes = values<float>(r.output("boxes").data);
    const auto ids = values<int64_t>(r.output("label_ids").data);
    const auto labels = rpc::unpack_bytes(r.output("labels").data);
    ASSERT_EQ(labels.size(), static_cast<size_t>(2 * k));
    for (int64_t i = 0; i < 2; ++i) {
      const std::string p = "batch_img" + std::to_string(i) + "_";
      const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      const auto el = expected->get(p + "labels", at::kLong, at::kCPU);
      const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      const auto names = cm.at("results")[i].at("text_labels").get<std::vector<std::string>>();
      ASSERT_EQ(counts.at(i), es.size(0)) << "image " << i;
      double ds = 0, db = 0;
      for (int64_t j = 0; j < counts[i]; ++j) {
        const int64_t row = i * k + j;
        ds = std::max(ds, std::abs(double(scores[row]) - es[j].item<float>()));
        EXPECT_EQ(labels[row], names[j]) << "image " << i << " box " << j;
        EXPECT_EQ(ids[row], el[j].item<int64_t>()) << "image " << i << " box " << j;
        for (int q = 0; q < 4; ++q)
          db = std::max(db, std::abs(double(boxes[row * 4 + q]) - eb[j][q].item<float>()));
      }
      std::cout << "[" << fixture << " batch image " << i << "] " << counts[i]
                << " detections, max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px\n";
      EXPECT_LE(ds, 1e-4);
      EXPECT_LE(db, 1e-2);
    }
    // A label past 75 tokens is cut (the processor truncates every text to 77) and reported.
    std::string long_label;
    for (int i = 0; i < 80; ++i) long_label += "cat ";
    const auto one = rpc::pack_bytes({read_file(kFixtures + "/images/chelsea.jpg")});
    const auto cut =
        c.infer(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({"a dog. " + long_label})});
    ASSERT_TRUE(cut.ok()) << cut.message;
    const auto& lp = cut.output("labels").parameters;
    ASSERT_EQ(lp.count("truncated_labels"), 1u);
    EXPECT_EQ(std::get<std::string>(lp.at("truncated_labels")), "0:1");
    EXPECT_EQ(std::get<int64_t>(lp.at("max_text_tokens")), 77);
    // The contract's refusals, worded as for OWL-ViT and Grounding DINO.
    auto refused = [&](const std::string& request, const std::vector<std::string>& raw_inputs,
                       const std::string& message) {
      const auto e = c.infer(request, raw_inputs);
      EXPECT_EQ(e.code, api::Code::invalid_argument) << message;
      EXPECT_NE(e.message.find(message), std::string::npos) << e.message;
    };
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({" . . "})},
            "input 'text': prompt 0 has no label");
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({std::string("a \xff cat")})},
            "input 'text': element 0 is not UTF-8 (text: invalid UTF-8 at byte 2)");
    std::string many;
    for (int i = 0; i < 10000; ++i) many += "x.";
    refused(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({many})},
            "input 'text': prompt 0 has 10000 labels, more than the 256 this model takes");
    refused(infer_text(fixture, 1, "1",
                       "parameters { key: \"text_threshold\" value { double_param: 0.3 } }"),
            {one, rpc::pack_bytes({"a cat"})}, "parameter 'text_threshold': model_type");
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
