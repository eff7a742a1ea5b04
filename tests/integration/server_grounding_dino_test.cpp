// Grounding DINO / MM Grounding DINO served end to end through the open-vocabulary contract
// (server/tasks/prompted_detection_io.h): the grounding_dino_tiny and mm_grounding_dino_tiny
// fixture folders (with their BERT tokenizer files) in a model repository, the fixtures'
// photographs as JPEGs over gRPC with their prompts, against transformers'
// post_process_grounded_object_detection of the same images at the fixture's box and text
// thresholds: counts, phrases (the `labels` output), scores and boxes in original pixels. Then
// the prompt cache (a repeated request's bytes equal to the first answer's and to a model
// without a cache; its hits and misses in /metrics), labels cut at max_text_len, and the refusals
// of a phrase past the text encoder's positions and of a listed label the caption cannot hold.
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

std::string thresholds(double box, double text) {
  return c10::str("parameters { key: \"box_threshold\" value { double_param: ", box,
                  " } } parameters { key: \"text_threshold\" value { double_param: ", text, " } }");
}

std::string infer_text(const std::string& model, int64_t images, const std::string& text_shape,
                       const std::string& extra = "") {
  return "model_name: \"" + model +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " + std::to_string(images) +
         " } inputs { name: \"text\" datatype: \"BYTES\" shape: " + text_shape + " } " + extra;
}

class ServerGroundingDino : public ::testing::TestWithParam<const char*> {};

TEST_P(ServerGroundingDino, PromptedJpegsMatchTheFixturesPostProcessing) {
  const std::string fixture = GetParam();
  const auto repo = temp_dir("grounding_dino_serving");
  // The model with its prompt cache (the default 64 MiB) and the same checkpoint without.
  const std::string uncached = fixture + "_uncached";
  const fs::path src = fs::path(kFixtures) / "models" / fixture;
  for (const auto& [name, cache] :
       {std::pair{fixture, ""}, std::pair{uncached, "prompt_cache_mb: 0\n"}}) {
    add_fixture_model(repo, name, fixture,
                      std::string("device: cpu\nwarmup: true\nmax_batch_size: 4\n") + cache);
  }
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected =
        models::core::SafetensorsFile::open((src / "expected.safetensors").string());
    const auto meta = nlohmann::json::parse(read_file((src / "meta.json").string()));
    // Case "batch": two JPEGs padded into one batch (pixel_mask), prompts in the "a. b." form;
    // case "labels": a JSON list of labels, merged as the processor merges it.
    struct Case {
      const char* name;
      std::vector<const char*> images;
      std::vector<std::string> text;
    };
    const Case cases[] = {{"batch",
                           {"astronaut.jpg", "coffee.jpg"},
                           {"a person. a flag.", "a coffee cup. a spoon? table."}},
                          {"labels", {"chelsea.jpg"}, {R"(["a cat", "A Dog", "remote control"])"}}};
    std::vector<rpc::InferResult> first;  // each case's answer
    auto send = [&](const Case& cs, const std::string& model) {
      std::vector<std::string> raw;
      for (const char* im : cs.images) raw.push_back(read_file(kFixtures + "/images/" + im));
      const auto& cm = meta.at("cases").at(cs.name);
      const auto n = static_cast<int64_t>(cs.images.size());
      return c.infer(infer_text(model, n, std::to_string(n),
                                thresholds(cm.at("box_threshold"), cm.at("text_threshold"))),
                     {rpc::pack_bytes(raw), rpc::pack_bytes(cs.text)});
    };
    for (const auto& cs : cases) {
      const auto& cm = meta.at("cases").at(cs.name);
      const auto n = static_cast<int64_t>(cs.images.size());
      const auto r = send(cs, fixture);
      ASSERT_TRUE(r.ok()) << r.message;
      first.push_back(r);
      const auto counts = values<int32_t>(r.output("num_detections").data);
      const int64_t k = r.output("scores").shape.at(1);
      const auto scores = values<float>(r.output("scores").data);
      const auto boxes = values<float>(r.output("boxes").data);
      const auto labels = rpc::unpack_bytes(r.output("labels").data);
      ASSERT_EQ(labels.size(), static_cast<size_t>(n * k));
      for (int64_t i = 0; i < n; ++i) {
        const std::string p = std::string(cs.name) + "_img" + std::to_string(i) + "_";
        const auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
        const auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
        const auto phrases = cm.at("results")[i].at("text_labels").get<std::vector<std::string>>();
        ASSERT_EQ(counts.at(i), es.size(0)) << cs.name << " image " << i;
        double ds = 0, db = 0;
        for (int64_t j = 0; j < counts[i]; ++j) {
          const int64_t row = i * k + j;
          ds = std::max(ds, std::abs(double(scores[row]) - es[j].item<float>()));
          EXPECT_EQ(labels[row], phrases[j]) << cs.name << " image " << i << " box " << j;
          for (int q = 0; q < 4; ++q)
            db = std::max(db, std::abs(double(boxes[row * 4 + q]) - eb[j][q].item<float>()));
        }
        std::cout << "[" << fixture << " " << cs.name << " image " << i << "] " << counts[i]
                  << " detections, max |score - expected| = " << ds
                  << ", max |box - expected| = " << db << " px\n";
        EXPECT_LE(ds, 1e-4);
        EXPECT_LE(db, 1e-2);
      }
    }
    // The cache: case "batch" again (its two captions hit, the vision forward only) answers the
    // bytes of its first answer (two misses) and of the model without a cache.
    for (const auto& model : {fixture, uncached}) {
      const auto again = send(cases[0], model);
      ASSERT_TRUE(again.ok()) << again.message;
      for (const char* out : {"num_detections", "scores", "boxes", "labels"})
        EXPECT_EQ(again.output(out).data, first[0].output(out).data) << model << " " << out;
    }
    // 130 labels "cat": [CLS] then "cat ." pairs, so labels 127.. end past max_text_len (256):
    // cut (the model drops those ids, as upstream) and reported.
    std::string many;
    for (int i = 0; i < 130; ++i) many += "cat. ";
    const auto one = rpc::pack_bytes({read_file(kFixtures + "/images/chelsea.jpg")});
    const auto cut = c.infer(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({many})});
    ASSERT_TRUE(cut.ok()) << cut.message;
    const auto& lp = cut.output("labels").parameters;
    ASSERT_EQ(lp.count("truncated_labels"), 1u);
    EXPECT_EQ(std::get<std::string>(lp.at("truncated_labels")), "0:127,0:128,0:129");
    EXPECT_EQ(std::get<int64_t>(lp.at("max_text_tokens")), 256);
    // One phrase longer than the text encoder's position table (this tiny BERT has 64 positions;
    // transformers fails on it with an index error): INVALID_ARGUMENT naming the tensor.
    std::string long_label;
    for (int i = 0; i < 300; ++i) long_label += "cat ";
    const auto too_long =
        c.infer(infer_text(fixture, 1, "1"), {one, rpc::pack_bytes({"a dog. " + long_label})});
    EXPECT_EQ(too_long.code, api::Code::invalid_argument);
    EXPECT_NE(too_long.message.find("bert: position_ids must be in [0, 64), got [0, 251]"),
              std::string::npos)
        << too_long.message;
    // A listed label holding '.' cannot be one phrase of the caption.
    const auto dot = c.infer(infer_text(fixture, 1, "1"),
                             {one, rpc::pack_bytes({R"(["st. bernard", "a cat"])"})});
    EXPECT_EQ(dot.code, api::Code::invalid_argument);
    EXPECT_NE(
        dot.message.find("input 'text': labels[0][0]: text: label 'st. bernard' contains '.'"),
        std::string::npos)
        << dot.message;
    // Misses: the three captions of the two cases, then the 130 labels' (the refused requests
    // fail before the cache or in its text forward: not counted); hits: the repeated two.
    const std::string metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_EQ(prompt_cache_count(metrics, fixture, "hits"), 2) << metrics;
    EXPECT_EQ(prompt_cache_count(metrics, fixture, "misses"), 4) << metrics;
    for (const char* counter : {"hits", "misses"})  // prompt_cache_mb: 0: no cache, no series
      EXPECT_EQ(prompt_cache_count(metrics, uncached, counter), -1) << metrics;
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServerGroundingDino,
                         ::testing::Values("grounding_dino_tiny", "mm_grounding_dino_tiny"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace libreyolo::server
