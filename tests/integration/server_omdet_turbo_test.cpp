// OmDet-Turbo served end to end through the open-vocabulary contract
// (server/tasks/prompted_detection_io.h): the omdet_turbo_tiny fixture folder (with its CLIP
// tokenizer files) in a model repository, the fixture's "batch" photographs as JPEGs over gRPC
// with their classes (the processor's default task "Detect a, b."), against transformers'
// post_process_grounded_object_detection of the same images at the fixture's threshold and
// nms_threshold 0.5: counts, class texts (the `labels` output), class indices (`label_ids`),
// scores and boxes in original pixels. Then the contract's refusals, worded as for the other
// open-vocabulary families (an empty prompt, 10,000 labels, text that is not UTF-8). Then the
// family's own parameters `task` and `nms_threshold` (the fixture's "task" case at nms_threshold
// 0.5 and 0.05, over gRPC and REST, and their refusals), and two requests of different tasks,
// thresholds and nms_thresholds batched into one forward (the fixture's "mixed" case). Then the
// prompt cache: a repeated request's bytes equal to its first answer's and to a model without a
// cache; its hits and misses in /metrics.
#include <gtest/gtest.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <future>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

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

std::string param(const std::string& key, double value) {
  return c10::str("parameters { key: \"", key, "\" value { double_param: ", value, " } } ");
}

std::string param(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value { string_param: \"" + rpc::text_escape(value) +
         "\" } } ";
}

/// Image `i` of `r` (outputs scores, boxes, labels, num_detections) against the fixture's
/// post-processing `key` (<key>_scores / _boxes, meta.json's text labels `names`): the same
/// count and class texts, scores to 1e-4 and boxes to 1e-2 px.
void expect_fixture_detections(const rpc::InferResult& r, int64_t i,
                               const models::core::SafetensorsFile& expected,
                               const std::string& key, const std::vector<std::string>& names) {
  const auto counts = values<int32_t>(r.output("num_detections").data);
  const int64_t k = r.output("scores").shape.at(1);
  const auto scores = values<float>(r.output("scores").data);
  const auto boxes = values<float>(r.output("boxes").data);
  const auto labels = rpc::unpack_bytes(r.output("labels").data);
  const auto es = expected.get(key + "_scores", at::kFloat, at::kCPU);
  const auto eb = expected.get(key + "_boxes", at::kFloat, at::kCPU);
  ASSERT_EQ(counts.at(i), es.size(0)) << key;
  double ds = 0, db = 0;
  for (int64_t j = 0; j < counts[i]; ++j) {
    const int64_t row = i * k + j;
    ds = std::max(ds, std::abs(double(scores[row]) - es[j].item<float>()));
    EXPECT_EQ(labels[row], names.at(j)) << key << " box " << j;
    for (int q = 0; q < 4; ++q)
      db = std::max(db, std::abs(double(boxes[row * 4 + q]) - eb[j][q].item<float>()));
  }
  std::cout << "[omdet_turbo_tiny " << key << "] " << counts[i]
            << " detections, max |score - expected| = " << ds << ", max |box - expected| = " << db
            << " px\n";
  EXPECT_LE(ds, 1e-4) << key;
  EXPECT_LE(db, 1e-2) << key;
}

/// A fixture's expected.safetensors and meta.json.
struct FixtureFiles {
  std::shared_ptr<const models::core::SafetensorsFile> expected;
  nlohmann::json meta;
};

FixtureFiles fixture_files(const fs::path& src) {
  return {models::core::SafetensorsFile::open((src / "expected.safetensors").string()),
          nlohmann::json::parse(read_file((src / "meta.json").string()))};
}

const char* const kOutputs =
    "outputs { name: \"labels\" } outputs { name: \"scores\" } outputs { name: \"boxes\" } "
    "outputs { name: \"num_detections\" }";

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
    const int64_t k = r.output("scores").shape.at(1);
    const auto ids = values<int64_t>(r.output("label_ids").data);
    for (int64_t i = 0; i < 2; ++i) {
      const std::string key = "batch_img" + std::to_string(i);
      expect_fixture_detections(
          r, i, *expected, key,
          cm.at("results")[i].at("text_labels").get<std::vector<std::string>>());
      const auto el = expected->get(key + "_labels", at::kLong, at::kCPU);
      for (int64_t j = 0; j < el.size(0); ++j)
        EXPECT_EQ(ids.at(i * k + j), el[j].item<int64_t>()) << key << " box " << j;
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

    // `task` and `nms_threshold`: the "task" case (chelsea.jpg, its classes) with its task gives
    // the case's 18 boxes at the default nms_threshold and 16 at 0.05; without the task (the
    // default "Detect cat, remote control.") other scores.
    const auto& tc = meta.at("cases").at("task");
    const std::string task = tc.at("task");
    const auto cat = rpc::pack_bytes({read_file(kFixtures + "/images/chelsea.jpg")});
    const auto classes = rpc::pack_bytes({"cat. remote control."});
    const std::string th = param("threshold", tc.at("threshold").get<double>());
    const auto with_task =
        c.infer(infer_text(fixture, 1, "1", th + param("task", task) + kOutputs), {cat, classes});
    ASSERT_TRUE(with_task.ok()) << with_task.message;
    expect_fixture_detections(
        with_task, 0, *expected, "task_img0",
        tc.at("results")[0].at("text_labels").get<std::vector<std::string>>());
    const auto nms =
        c.infer(infer_text(fixture, 1, "1",
                           th + param("task", task) + param("nms_threshold", 0.05) + kOutputs),
                {cat, classes});
    ASSERT_TRUE(nms.ok()) << nms.message;
    expect_fixture_detections(
        nms, 0, *expected, "task_nms_img0",
        tc.at("nms_results").at("results")[0].at("text_labels").get<std::vector<std::string>>());
    EXPECT_EQ(nms.output("labels").parameters.count("truncated_task"), 0u);
    const auto plain = c.infer(infer_text(fixture, 1, "1", th + kOutputs), {cat, classes});
    ASSERT_TRUE(plain.ok()) << plain.message;
    EXPECT_NE(values<float>(plain.output("scores").data),
              values<float>(with_task.output("scores").data));
    // A task past 75 tokens is cut as the processor cuts it, and said.
    std::string long_task = "Detect";
    for (int i = 0; i < 80; ++i) long_task += " cat";
    const auto cut_task =
        c.infer(infer_text(fixture, 1, "1", param("task", long_task)), {cat, classes});
    ASSERT_TRUE(cut_task.ok()) << cut_task.message;
    ASSERT_EQ(cut_task.output("labels").parameters.count("truncated_task"), 1u);
    EXPECT_TRUE(std::get<bool>(cut_task.output("labels").parameters.at("truncated_task")));
    // Bad values: the whole message.
    auto refused_exactly = [&](const std::string& params, const std::string& message) {
      const auto e = c.infer(infer_text(fixture, 1, "1", params), {cat, classes});
      EXPECT_EQ(e.code, api::Code::invalid_argument) << message;
      EXPECT_EQ(e.message, message);
    };
    refused_exactly(param("nms_threshold", 1.5),
                    "parameter 'nms_threshold' must be in [0, 1], got 1.5");
    refused_exactly(param("nms_threshold", -0.25),
                    "parameter 'nms_threshold' must be in [0, 1], got -0.25");
    refused_exactly(param("nms_threshold", "0.3"),
                    "parameter 'nms_threshold' must be a number (double_param or int64_param)");
    refused_exactly(param("task", 0.5), "parameter 'task' must be a string, got double");
    refused_exactly(
        param("task", " \t "),
        "parameter 'task' is empty (leave it out for the default \"Detect <labels>.\")");
    // proto3 strings are UTF-8: a task that is not never reaches the parameter's own check.
    const auto not_utf8 =
        c.infer(infer_text(fixture, 1, "1", param("task", "Find \xff cats")), {cat, classes});
    EXPECT_EQ(not_utf8.code, api::Code::invalid_argument);
    EXPECT_EQ(not_utf8.message.rfind(
                  "ModelInfer: the request is not a valid inference.ModelInferRequest", 0),
              0u)
        << not_utf8.message;
    refused_exactly(param("task", std::string(65537, 'a')),
                    "parameter 'task' has 65537 bytes, more than the 65536 a prompt may have");

    // REST (KServe v2 JSON with the binary extension): the same parameters, the same answer.
    const std::string images =
        rpc::pack_bytes({read_file(kFixtures + "/images/chelsea.jpg")}).substr(4);
    const std::string labels = "cat. remote control.";
    const nlohmann::json head = {
        {"inputs",
         {{{"name", "images"},
           {"datatype", "BYTES"},
           {"shape", {1}},
           {"parameters", {{"binary_data_size", images.size() + 4}}}},
          {{"name", "text"},
           {"datatype", "BYTES"},
           {"shape", {1}},
           {"parameters", {{"binary_data_size", labels.size() + 4}}}}}},
        {"parameters",
         {{"threshold", tc.at("threshold")}, {"task", task}, {"nms_threshold", 0.05}}},
        {"outputs", {{{"name", "num_detections"}}}}};
    auto length = [](const std::string& b) {
      const auto n = static_cast<std::uint32_t>(b.size());
      return std::string(reinterpret_cast<const char*>(&n), 4) + b;
    };
    const std::string json_head = head.dump();
    const auto rest =
        http_request(daemon.http_port(), "POST", "/v2/models/" + fixture + "/infer",
                     json_head + length(images) + length(labels),
                     {"Inference-Header-Content-Length: " + std::to_string(json_head.size())});
    ASSERT_EQ(rest.status, 200) << rest.body;
    const auto reply = nlohmann::json::parse(rest.body);
    EXPECT_EQ(reply.at("outputs")[0].at("data")[0], 16) << rest.body;
    auto bad_head = head;
    bad_head["parameters"]["task"] = 3;
    const std::string bad_json = bad_head.dump();
    const auto bad =
        http_request(daemon.http_port(), "POST", "/v2/models/" + fixture + "/infer",
                     bad_json + length(images) + length(labels),
                     {"Inference-Header-Content-Length: " + std::to_string(bad_json.size())});
    EXPECT_EQ(bad.status, 400);
    EXPECT_NE(bad.body.find("parameter 'task' must be a string, got int64"), std::string::npos)
        << bad.body;

    // libreyolo-client detect --prompt --task: the "task" case's 18 boxes and their scores.
    const auto dir = temp_dir("omdet_client");
    const std::string log = (dir / "log.txt").string();
    const std::string cmd =
        std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-client detect --model " + fixture +
        " --image " + kFixtures + "/images/chelsea.jpg --prompt 'cat. remote control.' --task '" +
        task + "' --threshold " + c10::str(tc.at("threshold").get<double>()) +
        " --server 127.0.0.1:" + std::to_string(daemon.grpc_port()) + " > " + log + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
    const std::string printed = read_file(log);
    EXPECT_NE(printed.find("chelsea.jpg: 18 detections"), std::string::npos) << printed;
    const auto es = expected->get("task_img0_scores", at::kFloat, at::kCPU);
    for (int64_t j = 0; j < es.size(0); ++j) {
      std::ostringstream score;
      score << " score " << std::fixed << std::setprecision(4) << es[j].item<float>() << " box";
      EXPECT_NE(printed.find(score.str()), std::string::npos) << score.str() << "\n" << printed;
    }
    // --nms-threshold 0.05: the "task" case's post-processing at that IoU (16 boxes).
    const std::string cmd_nms =
        cmd.substr(0, cmd.find(" > ")) + " --nms-threshold 0.05 > " + log + " 2>&1";
    ASSERT_EQ(std::system(cmd_nms.c_str()), 0) << read_file(log);
    const std::string printed_nms = read_file(log);
    EXPECT_NE(printed_nms.find("chelsea.jpg: 16 detections"), std::string::npos) << printed_nms;
    const auto nms_scores = expected->get("task_nms_img0_scores", at::kFloat, at::kCPU);
    ASSERT_EQ(nms_scores.size(0), 16);
    for (int64_t j = 0; j < nms_scores.size(0); ++j) {
      std::ostringstream score;
      score << " score " << std::fixed << std::setprecision(4) << nms_scores[j].item<float>()
            << " box";
      EXPECT_NE(printed_nms.find(score.str()), std::string::npos) << score.str() << "\n"
                                                                  << printed_nms;
    }
    remove_tree(dir);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

// Two requests with different tasks, thresholds and nms_thresholds share one forward (batch 2:
// max_batch_size 2 and a queue delay long enough that the first waits for the second) and each
// gets its own rows' answer: the fixture's "mixed" case, made by transformers as one batch with
// the processor's task list and each row post-processed at its own parameters.
TEST(ServerOmDetTurbo, RequestsOfDifferentTasksBatchTogether) {
  const std::string fixture = "omdet_turbo_tiny";
  const auto repo = temp_dir("omdet_turbo_batching");
  add_fixture_model(repo, fixture, fixture,
                    "device: cpu\nwarmup: false\nmax_batch_size: 2\n"
                    "max_queue_delay_microseconds: 20000000\n");
  const fs::path src = fs::path(kFixtures) / "models" / fixture;
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    const std::string address = "127.0.0.1:" + std::to_string(daemon.grpc_port());
    const auto expected =
        models::core::SafetensorsFile::open((src / "expected.safetensors").string());
    const auto meta = nlohmann::json::parse(read_file((src / "meta.json").string()));
    const auto& cm = meta.at("cases").at("mixed");
    auto infer = [&](int64_t i) {
      // Row 0: the default task (no `task`), nms_threshold as given (the default, 0.5).
      std::string params = param("threshold", cm.at("thresholds")[i].get<double>()) +
                           param("nms_threshold", cm.at("nms_thresholds")[i].get<double>());
      if (i == 1) params += param("task", cm.at("tasks")[1].get<std::string>());
      std::string labels;
      for (const auto& l : cm.at("classes")[i]) labels += l.get<std::string>() + ". ";
      rpc::Client c(address, 64 << 20);
      return c.infer(infer_text(fixture, 1, "1", params + kOutputs),
                     {rpc::pack_bytes({read_file(kFixtures + "/images/" +
                                                 cm.at("images")[i].get<std::string>())}),
                      rpc::pack_bytes({labels})});
    };
    auto first = std::async(std::launch::async, infer, 0);
    auto second = std::async(std::launch::async, infer, 1);
    const rpc::InferResult r[] = {first.get(), second.get()};
    for (int64_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(r[i].ok()) << r[i].message;
      expect_fixture_detections(
          r[i], 0, *expected, "mixed_img" + std::to_string(i),
          cm.at("results")[i].at("text_labels").get<std::vector<std::string>>());
    }
    const auto metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_NE(metrics.find("libreyolo_batch_size_count{model=\"omdet_turbo_tiny\"} 1"),
              std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("libreyolo_batch_size_sum{model=\"omdet_turbo_tiny\"} 2"),
              std::string::npos);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

// The prompt cache (the default 64 MiB): a piece per class and per task sentence. The "task"
// case twice answers the same bytes (the second: every piece a hit) as the model without a cache
// (prompt_cache_mb: 0); its classes with the default task reuse the classes and miss the task.
TEST(ServerOmDetTurbo, RepeatedPromptsComeFromTheCache) {
  const std::string fixture = "omdet_turbo_tiny", uncached = "omdet_turbo_tiny_uncached";
  const auto repo = temp_dir("omdet_turbo_cache");
  add_fixture_model(repo, fixture, fixture, "device: cpu\nwarmup: false\n");
  add_fixture_model(repo, uncached, fixture, "device: cpu\nwarmup: false\nprompt_cache_mb: 0\n");
  const fs::path src = fs::path(kFixtures) / "models" / fixture;
  {
    Daemon daemon(loopback_config(repo));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto files = fixture_files(src);
    const auto& expected = files.expected;
    const auto& tc = files.meta.at("cases").at("task");
    const auto cat = rpc::pack_bytes({read_file(kFixtures + "/images/chelsea.jpg")});
    const auto classes = rpc::pack_bytes({"cat. remote control."});
    const std::string th = param("threshold", tc.at("threshold").get<double>());
    auto send = [&](const std::string& model, const std::string& task) {
      return c.infer(
          infer_text(model, 1, "1", th + (task.empty() ? "" : param("task", task)) + kOutputs),
          {cat, classes});
    };
    const std::string task = tc.at("task");
    const auto first = send(fixture, task);  // misses: cat, remote control, the task
    ASSERT_TRUE(first.ok()) << first.message;
    expect_fixture_detections(
        first, 0, *expected, "task_img0",
        tc.at("results")[0].at("text_labels").get<std::vector<std::string>>());
    for (const auto& model : {fixture, uncached}) {  // hits: the three
      const auto again = send(model, task);
      ASSERT_TRUE(again.ok()) << again.message;
      for (const char* out : {"num_detections", "scores", "boxes", "labels"})
        EXPECT_EQ(again.output(out).data, first.output(out).data) << model << " " << out;
    }
    const auto plain = send(fixture, "");  // hits: the classes; miss: "Detect cat, remote ..."
    ASSERT_TRUE(plain.ok()) << plain.message;
    const auto plain_uncached = send(uncached, "");
    ASSERT_TRUE(plain_uncached.ok()) << plain_uncached.message;
    EXPECT_EQ(plain.output("scores").data, plain_uncached.output("scores").data);
    EXPECT_EQ(plain.output("boxes").data, plain_uncached.output("boxes").data);
    const std::string metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_EQ(prompt_cache_count(metrics, fixture, "hits"), 5) << metrics;
    EXPECT_EQ(prompt_cache_count(metrics, fixture, "misses"), 4) << metrics;
    EXPECT_EQ(prompt_cache_count(metrics, uncached, "hits"), -1) << metrics;
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
