// The HTTP port (server/http/): KServe v2 REST with Triton's binary tensor data, repository and
// statistics extensions, against the real daemon on loopback, with the gRPC side as the
// reference for every inference output; and the pure request/response codec
// (server/http/kserve_json.h) on its own, datatype by datatype.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <future>
#include <set>

#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/http/kserve_json.h"
#include "server/shm/registry.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;
using nlohmann::json;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

/// A binary-extension infer body: JSON header `head` followed by `binary`.
struct Body {
  std::string text;
  std::size_t header = 0;
};
Body binary_body(const json& head, const std::string& binary) {
  Body b;
  b.text = head.dump();
  b.header = b.text.size();
  b.text += binary;
  return b;
}

HttpExchange post_infer(int port, const std::string& model, const Body& b) {
  return http_request(port, "POST", "/v2/models/" + model + "/infer", b.text,
                      {"Inference-Header-Content-Length: " + std::to_string(b.header)});
}

/// The outputs of a binary response, by name (raw bytes), and its JSON header.
std::map<std::string, std::string> binary_outputs(const HttpExchange& r, json* head = nullptr) {
  std::map<std::string, std::string> out;
  const std::size_t n = std::stoul(r.header("inference-header-content-length"));
  const json h = json::parse(r.body.substr(0, n));
  std::size_t at = n;
  for (const auto& o : h["outputs"]) {
    const std::size_t size = o["parameters"]["binary_data_size"];
    out[o["name"]] = r.body.substr(at, size);
    at += size;
  }
  EXPECT_EQ(at, r.body.size());
  if (head) *head = h;
  return out;
}

/// The value of the Prometheus sample line starting with `series` (0 when absent).
double metric(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + series.size() + 2));
}

class ServerHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("http"));
    add_rtdetr_tiny(*repo_, "warmup: false\n");
    add_fake_model(*repo_, "fake", "max_batch_size: 1\nmax_queue_size: 4\n");
    auto c = loopback_config(*repo_);
    daemon_ = new Daemon(c, fake_or_real());
    daemon_->start();
    grpc_ = new std::string("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  static void TearDownTestSuite() {
    delete daemon_;
    remove_tree(*repo_);
    delete repo_;
    delete grpc_;
  }
  void SetUp() override { FakeState::get().reset(); }
  static int port() { return daemon_->http_port(); }

  static fs::path* repo_;
  static Daemon* daemon_;
  static std::string* grpc_;
};
fs::path* ServerHttp::repo_ = nullptr;
Daemon* ServerHttp::daemon_ = nullptr;
std::string* ServerHttp::grpc_ = nullptr;

TEST_F(ServerHttp, HealthServerAndModelMetadata) {
  auto r = http_request(port(), "GET", "/v2/health/live");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"live\":true}");
  EXPECT_EQ(r.header("content-type"), "application/json");
  r = http_request(port(), "HEAD", "/v2/health/ready");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  r = http_request(port(), "GET", "/v2");
  EXPECT_EQ(r.status, 200);
  // cuda_shared_memory only in a build with CUDA (server/shm/registry.h), as over gRPC.
  json want = json::parse(R"({"name": "libreyolo-server", "version": "0.1.0",
      "extensions": ["model_configuration", "statistics", "model_repository",
                     "system_shared_memory"]})");
  if (shm::Registry::cuda_built()) want["extensions"].push_back("cuda_shared_memory");
  EXPECT_EQ(json::parse(r.body), want);

  r = http_request(port(), "GET", "/v2/models/fake/ready");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"ready\":true}");
  r = http_request(port(), "GET", "/v2/models/fake/versions/1/ready");
  EXPECT_EQ(r.status, 200);
  r = http_request(port(), "GET", "/v2/models/fake/versions/7/ready");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "{\"ready\":false}");
  EXPECT_EQ(http_request(port(), "GET", "/v2/models/nope/ready").status, 503);

  r = http_request(port(), "GET", "/v2/models/rtdetr_tiny");
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = json::parse(r.body);
  EXPECT_EQ(m["name"], "rtdetr_tiny");
  EXPECT_EQ(m["versions"], json::parse(R"(["1"])"));
  EXPECT_EQ(m["platform"], "libreyolo_rt_detr");
  EXPECT_EQ(m["inputs"], json::parse(R"([
      {"name": "images", "datatype": "BYTES", "shape": [-1, 1]},
      {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, -1, -1]},
      {"name": "target_sizes", "datatype": "INT64", "shape": [-1, 2]}])"));
  EXPECT_EQ(m["outputs"][5], json::parse(R"({"name": "logits", "datatype": "FP32",
      "shape": [-1, 30, 10]})"));
  EXPECT_EQ(http_request(port(), "GET", "/v2/models/rtdetr_tiny/versions/1").body, r.body);

  r = http_request(port(), "GET", "/v2/models/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "{\"error\":\"unknown model 'nope'\"}");
  r = http_request(port(), "GET", "/v2/models/rtdetr_tiny/versions/7");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(json::parse(r.body)["error"].get<std::string>().find("has no version '7'"),
            std::string::npos)
      << r.body;
}

TEST_F(ServerHttp, ConfigStatisticsRepository) {
  auto r = http_request(port(), "GET", "/v2/models/fake/config");
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = json::parse(r.body);
  EXPECT_EQ(c["name"], "fake");
  EXPECT_EQ(c["max_batch_size"], 1);
  EXPECT_EQ(c["dynamic_batching"]["default_queue_policy"]["max_queue_size"], 4);
  EXPECT_EQ(c["input"][0], json::parse(R"({"name": "images", "data_type": "TYPE_STRING",
      "dims": [1], "optional": true})"));
  EXPECT_EQ(c["parameters"]["task"], json::parse(R"({"string_value": "object_detection"})"));

  rpc::Client grpc(*grpc_);
  ASSERT_TRUE(grpc.infer("model_name: \"fake\" inputs { name: \"images\" datatype: \"BYTES\" "
                         "shape: 1 }",
                         {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})})
                  .ok());
  r = http_request(port(), "GET", "/v2/models/fake/stats");
  ASSERT_EQ(r.status, 200) << r.body;
  const json s = json::parse(r.body)["model_stats"];
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["name"], "fake");
  EXPECT_EQ(s[0]["version"], "1");
  EXPECT_GE(s[0]["inference_count"].get<int>(), 1);
  EXPECT_GE(s[0]["inference_stats"]["success"]["count"].get<int>(), 1);
  EXPECT_EQ(s[0]["batch_stats"][0]["batch_size"], 1);
  r = http_request(port(), "GET", "/v2/models/stats");
  ASSERT_EQ(r.status, 200);
  std::set<std::string> names;
  const json all = json::parse(r.body);
  for (const auto& m : all["model_stats"]) names.insert(m["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"fake", "rtdetr_tiny"})) << r.body;
  EXPECT_EQ(http_request(port(), "GET", "/v2/models/nope/stats").status, 404);

  r = http_request(port(), "POST", "/v2/repository/index", "{\"ready\": true}");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body), json::parse(R"([
      {"name": "fake", "version": "1", "state": "READY", "reason": ""},
      {"name": "rtdetr_tiny", "version": "1", "state": "READY", "reason": ""}])"));
  EXPECT_EQ(http_request(port(), "POST", "/v2/repository/index").status, 200);
  r = http_request(port(), "POST", "/v2/repository/index", "{\"ready\": 1}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "{\"error\":\"'ready' must be true or false, got number\"}");
  r = http_request(port(), "POST", "/v2/repository/models/fake/load");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.body,
            "{\"error\":\"model control is disabled (server.model_control: none): models are "
            "loaded at start-up only\"}");
  r = http_request(port(), "POST", "/v2/repository/models/fake/unload", "{}");
  EXPECT_EQ(r.status, 403);
}

/// Binary tensors both ways on the real RT-DETR: every output equals the gRPC path's bytes.
TEST_F(ServerHttp, BinaryInferEqualsGrpc) {
  const std::string jpg = read_file(kFixtures + "/images/astronaut.jpg");
  const std::string packed = rpc::pack_bytes({jpg});
  rpc::Client grpc(*grpc_, 64 << 20);
  const auto g = grpc.infer(
      "model_name: \"rtdetr_tiny\" id: \"a1\" inputs { name: \"images\" datatype: \"BYTES\" "
      "shape: 1 } parameters { key: \"threshold\" value { double_param: 0.3 } }",
      {packed});
  ASSERT_TRUE(g.ok()) << g.message;

  const json head = {{"id", "a1"},
                     {"parameters", {{"threshold", 0.3}, {"binary_data_output", true}}},
                     {"inputs",
                      {{{"name", "images"},
                        {"datatype", "BYTES"},
                        {"shape", {1}},
                        {"parameters", {{"binary_data_size", packed.size()}}}}}}};
  const auto r = post_infer(port(), "rtdetr_tiny", binary_body(head, packed));
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 400);
  EXPECT_EQ(r.header("content-type"), "application/octet-stream");
  json h;
  const auto outputs = binary_outputs(r, &h);
  EXPECT_EQ(h["model_name"], "rtdetr_tiny");
  EXPECT_EQ(h["model_version"], "1");
  EXPECT_EQ(h["id"], "a1");
  ASSERT_EQ(outputs.size(), g.outputs.size());
  for (std::size_t i = 0; i < g.outputs.size(); ++i) {
    const auto& t = g.outputs[i];
    EXPECT_EQ(h["outputs"][i]["name"], t.name);
    EXPECT_EQ(h["outputs"][i]["datatype"], t.datatype);
    EXPECT_EQ(h["outputs"][i]["shape"].get<std::vector<int64_t>>(), t.shape);
    EXPECT_EQ(outputs.at(t.name), t.data) << t.name;
  }
  EXPECT_GT(values<int32_t>(outputs.at("num_detections")).at(0), 0);
}

/// JSON tensors both ways on the fake detector (nested pixel_values, INT64 target_sizes):
/// the JSON numbers equal the gRPC path's raw outputs; per-output binary_data mixes both.
TEST_F(ServerHttp, JsonInferEqualsGrpc) {
  std::vector<float> pixels(3 * 16 * 16, 0.5f);
  const std::string raw_pixels(reinterpret_cast<const char*>(pixels.data()), pixels.size() * 4);
  const std::vector<int64_t> sizes = {400, 600};
  const std::string raw_sizes(reinterpret_cast<const char*>(sizes.data()), 16);
  rpc::Client grpc(*grpc_);
  const auto g = grpc.infer(
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 16, "
      "16] } inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] } outputs { name: "
      "\"scores\" } outputs { name: \"labels\" } outputs { name: \"boxes\" } outputs { name: "
      "\"label_names\" } outputs { name: \"num_detections\" }",
      {raw_pixels, raw_sizes});
  ASSERT_TRUE(g.ok()) << g.message;

  json nested = json::array();  // [1][3][16][16]
  json image = json::array();
  for (int c = 0; c < 3; ++c) {
    json plane = json::array();
    for (int y = 0; y < 16; ++y) plane.push_back(std::vector<double>(16, 0.5));
    image.push_back(plane);
  }
  nested.push_back(image);
  const json request = {{"inputs",
                         {{{"name", "pixel_values"},
                           {"datatype", "FP32"},
                           {"shape", {1, 3, 16, 16}},
                           {"data", nested}},
                          {{"name", "target_sizes"},
                           {"datatype", "INT64"},
                           {"shape", {1, 2}},
                           {"data", {400, 600}}}}},
                        {"outputs",
                         {{{"name", "scores"}},
                          {{"name", "labels"}},
                          {{"name", "boxes"}, {"parameters", {{"binary_data", true}}}},
                          {{"name", "label_names"}},
                          {{"name", "num_detections"}}}}};
  const auto r = http_request(port(), "POST", "/v2/models/fake/infer", request.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  // One binary output: the JSON header, then the boxes' bytes.
  const std::size_t n = std::stoul(r.header("inference-header-content-length"));
  const json h = json::parse(r.body.substr(0, n));
  // In the core's output order (scores, labels, boxes, num_detections, label_names), whatever
  // the order asked.
  ASSERT_EQ(h["outputs"].size(), 5u);
  std::vector<std::string> order;
  for (const auto& o : h["outputs"]) order.push_back(o["name"]);
  ASSERT_EQ(order, (std::vector<std::string>{"scores", "labels", "boxes", "num_detections",
                                             "label_names"}));
  const auto scores = values<float>(g.output("scores").data);
  ASSERT_EQ(h["outputs"][0]["data"].size(), scores.size());
  for (std::size_t i = 0; i < scores.size(); ++i)
    EXPECT_EQ(h["outputs"][0]["data"][i].get<float>(), scores[i]) << i;
  EXPECT_EQ(scores[0], 1.0f / (1.0f + std::exp(-2.0f)));  // the fake's logit 2
  EXPECT_EQ(h["outputs"][1]["data"].get<std::vector<int64_t>>(),
            values<int64_t>(g.output("labels").data));
  EXPECT_EQ(h["outputs"][2]["parameters"]["binary_data_size"], g.output("boxes").data.size());
  EXPECT_EQ(r.body.substr(n), g.output("boxes").data);
  std::multiset<std::string> label_names;
  for (const auto& s : h["outputs"][4]["data"]) label_names.insert(s.get<std::string>());
  EXPECT_EQ(label_names, (std::multiset<std::string>{"bird", "cat", "cat", "dog"}));
  EXPECT_EQ(h["outputs"][4]["datatype"], "BYTES");
  EXPECT_EQ(h["outputs"][3]["data"], json::parse("[4]"));
  EXPECT_EQ(h["outputs"][3]["shape"], json::parse("[1]"));

  // All JSON: no Inference-Header-Content-Length, application/json.
  json all_json = request;
  all_json["outputs"] = {{{"name", "num_detections"}}};
  const auto j = http_request(port(), "POST", "/v2/models/fake/infer", all_json.dump());
  ASSERT_EQ(j.status, 200) << j.body;
  EXPECT_EQ(j.header("inference-header-content-length"), "");
  EXPECT_EQ(j.header("content-type"), "application/json");
  EXPECT_EQ(json::parse(j.body),
            json::parse(R"({"model_name": "fake", "model_version": "1", "outputs": [
                {"name": "num_detections", "datatype": "INT32", "shape": [1], "data": [4]}]})"));
}

TEST_F(ServerHttp, InferErrorsAreStatusesWithJsonBodies) {
  auto infer = [&](const std::string& model, const std::string& body,
                   const std::vector<std::string>& headers = {}) {
    return http_request(port(), "POST", "/v2/models/" + model + "/infer", body, headers);
  };
  auto expect = [&](const HttpExchange& r, int status, const std::string& error) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_EQ(r.header("content-type"), "application/json");
    EXPECT_EQ(r.body, json({{"error", error}}).dump());
  };
  const std::string images =
      R"({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 40}}]})";
  expect(infer("fake", images + "abcd",
               {"Inference-Header-Content-Length: " + std::to_string(images.size())}),
         400, "input 'images': binary_data_size 40 exceeds the 4 bytes of binary data left");
  expect(infer("fake", images, {"Inference-Header-Content-Length: x1"}), 400,
         "Inference-Header-Content-Length 'x1' is not a byte count");
  expect(infer("fake", images, {"Inference-Header-Content-Length: 9999"}), 400,
         "Inference-Header-Content-Length 9999 exceeds the body's " +
             std::to_string(images.size()) + " bytes");
  expect(
      infer(
          "fake",
          R"({"inputs": [{"name": "target_sizes", "datatype": "INT64", "shape": [1, 2], "data": [1, 2, 3]}]})"),
      400, "input 'target_sizes': data has more than the 2 elements of shape [1,2]");
  expect(
      infer("fake",
            R"({"inputs": [{"name": "t", "datatype": "INT8", "shape": [2], "data": [1, 300]}]})"),
      400, "input 't': element 1 of data must be an integer from -128 to 127 for INT8, got 300");
  expect(
      infer("fake", R"({"inputs": [{"name": "t", "datatype": "FP8", "shape": [1], "data": [1]}]})"),
      400,
      "input 't': unknown datatype 'FP8' (BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
      "INT32, INT64, FP16, BF16, FP32, FP64, BYTES)");
  expect(infer("fake", R"({"inputs": []})"), 400,
         "missing input: send 'images' (BYTES [N]) or 'pixel_values' (FP32 [N,3,H,W])");
  expect(infer("nope", R"({"inputs": []})"), 404, "unknown model 'nope'");
  const auto bad_json = infer("fake", "{x");
  EXPECT_EQ(bad_json.status, 400);
  EXPECT_EQ(json::parse(bad_json.body)["error"].get<std::string>().rfind(
                "the request body is not valid JSON: [json.exception.parse_error.101] parse "
                "error at line 1, column 2",
                0),
            0u)
      << bad_json.body;
  // Hostile nesting (a 60,000-deep value once crashed the daemon: json::dump recursed per
  // level): refused while parsing; structured values are named, not echoed.
  expect(infer("fake", R"({"inputs": [], "parameters": {"timeout": )" + std::string(60000, '[') +
                           std::string(60000, ']') + "}}"),
         400, "the request body nests JSON deeper than 32 levels");
  // A flood of values (a 64 MiB body of "0," parses into about 1 GB of DOM): refused while
  // parsing, at 4 Mi values. One below the budget parses and reaches the tensor checks.
  auto int8_data = [](int64_t n) {
    std::string b = R"({"inputs": [{"name": "t", "datatype": "INT8", "shape": [1], "data": [)";
    b.reserve(b.size() + 2 * static_cast<std::size_t>(n) + 8);
    for (int64_t i = 0; i < n; ++i) b += i ? ",0" : "0";
    return b + "]}]}";
  };
  expect(infer("fake", int8_data(4194302)), 400,
         "the request body holds more than 4194304 JSON values; send large tensors in binary "
         "(Inference-Header-Content-Length) or through shared memory");
  const auto within = infer("fake", int8_data(4194301));  // + "t", "INT8", 1: exactly 4 Mi
  EXPECT_EQ(within.status, 400);
  EXPECT_EQ(json::parse(within.body)["error"].get<std::string>().find("JSON values"),
            std::string::npos)
      << within.body.substr(0, 200);
  expect(infer("fake", R"({"inputs": [], "parameters": {"timeout": [[1]]}})"), 400,
         "parameter 'timeout' (microseconds) must be an integer >= 0, got an array");
  expect(infer("fake",
               R"({"inputs": [{"name": "t", "datatype": "INT8", "shape": [[1]], "data": [1]}]})"),
         400, "input 't': 'shape' must hold integers >= 0, got an array");
  // The core's own checks come through with their message (as on gRPC).
  const auto wrong =
      infer("fake",
            R"({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1], "data": [1.0]}]})");
  EXPECT_EQ(wrong.status, 400) << wrong.body;
  expect(
      infer(
          "fake",
          R"({"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "outputs": [{"name": "scores", "parameters": {"classification": 3}}]})"),
      400,
      "output 'scores': the classification extension is not supported (classifiers return "
      "scores, labels and label_names: server/README.md)");

  // Transport-level refusals, before any body is read.
  expect(http_request(port(), "GET", "/v2/models/fake/infer"), 405,
         "GET /v2/models/fake/infer: use POST");
  expect(http_request(port(), "PUT", "/v2/health/live", "x"), 405, "PUT /v2/health/live: use GET");
  expect(http_request(port(), "GET", "/nothing"), 404, "not found: /nothing");
  expect(http_request(port(), "GET", "/v2/models//ready"), 404, "not found: /v2/models//ready");
  expect(http_request(port(), "POST", "/v2/models/fake/infer", "", {}, false), 411,
         "POST /v2/models/fake/infer: Content-Length is required");
  expect(http_request(port(), "POST", "/v2/models/fake/infer", "abc", {"Content-Encoding: gzip"}),
         415, "Content-Encoding 'gzip' is not supported: send the body uncompressed");
  // 16 MiB (loopback_config's max_message_bytes) + 1: refused from the header alone.
  expect(http_request(port(), "POST", "/v2/models/fake/infer", "",
                      {"Content-Length: " + std::to_string((16 << 20) + 1)}, false),
         413, "request body of 16777217 bytes exceeds server.max_message_bytes (16777216 bytes)");
  EXPECT_EQ(http_request(port(), "GET", "/v2/health/ready").status, 200);
}

/// Triton's `timeout` parameter (microseconds) is the request's deadline: a request stuck in the
/// queue behind a slow one is answered 504 without running.
TEST_F(ServerHttp, TimeoutParameterIsTheDeadline) {
  FakeState::get().sleep_ms = 600;
  const std::string jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  auto slow = std::async(std::launch::async, [&] {
    rpc::Client c(*grpc_);
    return c.infer("model_name: \"fake\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
                   {jpg});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const json head = {{"parameters", {{"timeout", 50000}}},
                     {"inputs",
                      {{{"name", "images"},
                        {"datatype", "BYTES"},
                        {"shape", {1}},
                        {"parameters", {{"binary_data_size", jpg.size()}}}}}}};
  const auto r = post_infer(port(), "fake", binary_body(head, jpg));
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(
      json::parse(r.body)["error"].get<std::string>().rfind("model 'fake': deadline exceeded", 0),
      0u)
      << r.body;
  EXPECT_TRUE(slow.get().ok());
  FakeState::get().sleep_ms = 0;
}

/// A client that disconnects while its request waits is cancelled: the queue slot is freed and
/// the request counted CANCELLED.
TEST_F(ServerHttp, DisconnectCancelsTheRequest) {
  const std::string series =
      "libreyolo_inference_requests_total{code=\"CANCELLED\",model=\"fake\",version=\"1\"}";
  const double before = metric(http_get(port(), "/metrics").body, series);
  FakeState::get().sleep_ms = 800;
  const std::string jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  auto slow = std::async(std::launch::async, [&] {
    rpc::Client c(*grpc_);
    return c.infer("model_name: \"fake\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
                   {jpg});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const json head = {{"inputs",
                      {{{"name", "images"},
                        {"datatype", "BYTES"},
                        {"shape", {1}},
                        {"parameters", {{"binary_data_size", jpg.size()}}}}}}};
  const Body b = binary_body(head, jpg);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string req = "POST /v2/models/fake/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                          std::to_string(b.text.size()) +
                          "\r\nInference-Header-Content-Length: " + std::to_string(b.header) +
                          "\r\n\r\n" + b.text;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ::close(fd);  // while the slow request still runs: this one is queued
  EXPECT_TRUE(slow.get().ok());
  FakeState::get().sleep_ms = 0;
  double after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = metric(http_get(port(), "/metrics").body, series);
  }
  EXPECT_EQ(after, before + 1);
  // Only the slow request ran a forward.
  EXPECT_EQ(FakeState::get().batches(), std::vector<int64_t>{1});
}

/// Keep-alive: several requests on one connection, answered in order.
TEST_F(ServerHttp, KeepAliveServesSeveralRequests) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string two =
      "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/models/fake/ready HTTP/1.1\r\nHost: "
      "x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, two.data(), two.size(), MSG_NOSIGNAL), static_cast<ssize_t>(two.size()));
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  EXPECT_EQ(raw.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << raw;
  const auto second = raw.find("HTTP/1.1 200 OK\r\n", 10);
  ASSERT_NE(second, std::string::npos) << raw;
  EXPECT_NE(raw.find("{\"live\":true}"), std::string::npos);
  EXPECT_EQ(raw.substr(raw.size() - 14), "{\"ready\":true}");
}

/// API answers ignore Range entirely: neither an unsatisfiable nor an unparsable one is a 416,
/// and the answer is the whole document.
TEST_F(ServerHttp, RangeHeadersAreIgnored) {
  json infer = {{"inputs",
                 {{{"name", "pixel_values"},
                   {"datatype", "FP32"},
                   {"shape", {1, 3, 16, 16}},
                   {"data", std::vector<double>(3 * 16 * 16, 0.5)}},
                  {{"name", "target_sizes"},
                   {"datatype", "INT64"},
                   {"shape", {1, 2}},
                   {"data", {400, 600}}}}},
                {"outputs", {{{"name", "num_detections"}}}}};
  const std::string expected_infer =
      "{\"model_name\":\"fake\",\"model_version\":\"1\",\"outputs\":[{\"data\":[4],"
      "\"datatype\":\"INT32\",\"name\":\"num_detections\",\"shape\":[1]}]}";
  for (const std::string range :
       {"Range: bytes=999999-", "Range: garbage", "Range: bytes=5-2", "Range: bytes=0-3,6-9"}) {
    auto r = http_request(port(), "GET", "/v2/health/ready", "", {range});
    EXPECT_EQ(r.status, 200) << range;
    EXPECT_EQ(r.body, "{\"ready\":true}") << range;
    EXPECT_EQ(r.header("content-range"), "") << range;
    r = http_request(port(), "POST", "/v2/models/fake/infer", infer.dump(), {range});
    EXPECT_EQ(r.status, 200) << range;
    EXPECT_EQ(r.body, expected_infer) << range;
    EXPECT_EQ(r.header("content-type"), "application/json") << range;
  }
}

TEST(ServerHttpConfig, HttpThreadsKey) {
  const auto d = parse_config("", "", {}, {});
  EXPECT_EQ(d.http_threads.value, 32);
  const auto c = parse_config("server:\n  http_threads: 7\n", "s.yaml", {}, {});
  EXPECT_EQ(c.http_threads.value, 7);
  EXPECT_NE(describe(c).find("  http_threads: 7  # s.yaml:2:17\n"), std::string::npos)
      << describe(c);
  for (const char* v : {"1", "1025", "-3"}) {
    try {
      parse_config(std::string("server:\n  http_threads: ") + v + "\n", "bad.yaml", {}, {});
      ADD_FAILURE() << v;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()),
                "bad.yaml:2:17: server.http_threads must be between 2 and 1024");
    }
  }
}

// --- the codec alone (server/http/kserve_json.h) ------------------------------------------------

http::ParsedInfer parse(const std::string& body) {
  return http::parse_infer_request(body, std::nullopt, "m", "");
}

TEST(KserveJson, EveryDatatypeFromJsonData) {
  const auto p = parse(R"({"id": "q", "parameters": {"top_k": 3, "big": 18446744073709551615,
      "f": 0.5, "s": "x", "b": true}, "inputs": [
      {"name": "b", "datatype": "BOOL", "shape": [3], "data": [true, false, true]},
      {"name": "u8", "datatype": "UINT8", "shape": [2], "data": [0, 255]},
      {"name": "u16", "datatype": "UINT16", "shape": [1], "data": [65535]},
      {"name": "u32", "datatype": "UINT32", "shape": [1], "data": [4294967295]},
      {"name": "u64", "datatype": "UINT64", "shape": [1], "data": [18446744073709551615]},
      {"name": "i8", "datatype": "INT8", "shape": [2], "data": [-128, 127]},
      {"name": "i16", "datatype": "INT16", "shape": [1], "data": [-32768]},
      {"name": "i32", "datatype": "INT32", "shape": [2, 1], "data": [[-7], [8]]},
      {"name": "i64", "datatype": "INT64", "shape": [1], "data": [-9223372036854775808]},
      {"name": "f16", "datatype": "FP16", "shape": [7], "data": [1.5, 65504, 0.1, -2, 70000, 6e-8, 1e-8]},
      {"name": "bf16", "datatype": "BF16", "shape": [3], "data": [1.5, 0.1, -2]},
      {"name": "f32", "datatype": "FP32", "shape": [2, 2], "data": [[1, 0.25], [-3.5, 1e30]]},
      {"name": "f64", "datatype": "FP64", "shape": [1], "data": [0.1]},
      {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["ab", "\u00e9"]}]})");
  const auto& r = p.request;
  EXPECT_EQ(r.model_name, "m");
  EXPECT_EQ(r.id, "q");
  EXPECT_EQ(std::get<std::int64_t>(r.parameters.at("top_k")), 3);
  EXPECT_EQ(std::get<std::uint64_t>(r.parameters.at("big")), 18446744073709551615ull);
  EXPECT_EQ(std::get<double>(r.parameters.at("f")), 0.5);
  EXPECT_EQ(std::get<std::string>(r.parameters.at("s")), "x");
  EXPECT_EQ(std::get<bool>(r.parameters.at("b")), true);
  ASSERT_EQ(r.inputs.size(), 14u);
  auto data = [&](std::size_t i) { return std::string(r.inputs[i].data()); };
  EXPECT_EQ(data(0), std::string("\x01\x00\x01", 3));
  EXPECT_EQ(data(1), std::string("\x00\xff", 2));
  EXPECT_EQ(values<uint16_t>(data(2)), std::vector<uint16_t>{65535});
  EXPECT_EQ(values<uint32_t>(data(3)), std::vector<uint32_t>{4294967295u});
  EXPECT_EQ(values<uint64_t>(data(4)), std::vector<uint64_t>{18446744073709551615ull});
  EXPECT_EQ(values<int8_t>(data(5)), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(values<int16_t>(data(6)), std::vector<int16_t>{-32768});
  EXPECT_EQ(values<int32_t>(data(7)), (std::vector<int32_t>{-7, 8}));
  EXPECT_EQ(r.inputs[7].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(values<int64_t>(data(8)), std::vector<int64_t>{INT64_MIN});
  // IEEE binary16, round to nearest even: 1.5, max, 0.1 (0x2e66), -2, overflow to +inf, the
  // smallest subnormal 2^-24, below half of it to 0.
  EXPECT_EQ(values<uint16_t>(data(9)),
            (std::vector<uint16_t>{0x3e00, 0x7bff, 0x2e66, 0xc000, 0x7c00, 0x0001, 0x0000}));
  EXPECT_EQ(values<uint16_t>(data(10)), (std::vector<uint16_t>{0x3fc0, 0x3dcd, 0xc000}));
  EXPECT_EQ(values<float>(data(11)), (std::vector<float>{1.0f, 0.25f, -3.5f, 1e30f}));
  EXPECT_EQ(values<double>(data(12)), std::vector<double>{0.1});
  EXPECT_EQ(data(13), std::string("\x02\x00\x00\x00"
                                  "ab"
                                  "\x02\x00\x00\x00"
                                  "\xc3\xa9",
                                  12));
  EXPECT_TRUE(r.inputs[13].typed);
  EXPECT_FALSE(r.deadline.has_value());
  EXPECT_TRUE(r.requested_outputs.empty());
  EXPECT_FALSE(p.format.binary_default);
}

TEST(KserveJson, BinaryDataAndFormat) {
  const std::string head =
      R"({"parameters": {"binary_data_output": true, "timeout": 2000000}, "inputs": [
      {"name": "a", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
      {"name": "b", "datatype": "FP32", "shape": [1], "data": [2]},
      {"name": "c", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 5}}],
      "outputs": [{"name": "x", "parameters": {"binary_data": false}}, {"name": "y"}]})";
  const std::string body =
      head + std::string("\x01\0\0\0\x02\0\0\0", 8) + std::string("\x01\0\0\0z", 5);
  const auto before = std::chrono::steady_clock::now();
  const auto p = http::parse_infer_request(body, std::to_string(head.size()), "m", "3");
  EXPECT_EQ(p.request.model_version, "3");
  EXPECT_EQ(values<int32_t>(std::string(p.request.inputs[0].data())), (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(p.request.inputs[0].typed);
  EXPECT_EQ(values<float>(std::string(p.request.inputs[1].data())), std::vector<float>{2.0f});
  EXPECT_EQ(std::string(p.request.inputs[2].data()), std::string("\x01\0\0\0z", 5));
  ASSERT_TRUE(p.request.deadline.has_value());
  const double s = std::chrono::duration<double>(*p.request.deadline - before).count();
  EXPECT_GE(s, 2.0);
  EXPECT_LT(s, 2.5);
  EXPECT_EQ(p.request.parameters.count("timeout"), 0u);
  EXPECT_EQ(p.request.parameters.count("binary_data_output"), 0u);
  EXPECT_EQ(p.request.requested_outputs, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE(p.format.is_binary("x"));
  EXPECT_TRUE(p.format.is_binary("y"));
  EXPECT_TRUE(p.format.is_binary("other"));

  auto error = [](const std::string& b, std::optional<std::string> h = std::nullopt) {
    try {
      http::parse_infer_request(b, h ? std::optional<std::string_view>(*h) : std::nullopt, "m", "");
    } catch (const api::Error& e) {
      EXPECT_EQ(e.code(), Code::invalid_argument);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error(body.substr(0, body.size() - 1), std::to_string(head.size())),
            "input 'c': binary_data_size 5 exceeds the 4 bytes of binary data left");
  EXPECT_EQ(error(body + "zz", std::to_string(head.size())),
            "2 bytes of binary data after the last input's (the binary_data_size parameters must "
            "add up to the body after Inference-Header-Content-Length)");
  const std::string int32_head =
      R"({"inputs": [{"name": "a", "datatype": "INT32", "shape": [3], "parameters": {"binary_data_size": 8}}]})";
  EXPECT_EQ(error(int32_head + std::string(8, '\0'), std::to_string(int32_head.size())),
            "input 'a': binary_data_size 8 does not match shape [3] of INT32 (12 bytes)");
  EXPECT_EQ(error(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]})"),
            "input 'a': neither 'data' nor the binary_data_size parameter is set");
  EXPECT_EQ(error(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1], "data": []}]})"),
            "input 'a': 'shape' must hold integers >= 0, got -1");
  EXPECT_EQ(
      error(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1, "x"]}]})"),
      "input 'a': element 1 of data must be a number for FP32, got a string");
  EXPECT_EQ(error(R"({"inputs": [{"name": "a", "datatype": "BOOL", "shape": [1], "data": [1]}]})"),
            "input 'a': element 0 of data must be true or false for BOOL, got 1");
  EXPECT_EQ(
      error(R"({"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "data": [-1]}]})"),
      "input 'a': element 0 of data must be an integer from 0 to 255 for UINT8, got -1");
  EXPECT_EQ(
      error(R"({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1.5]}]})"),
      "input 'a': element 0 of data must be an integer from -2147483648 to 2147483647 for "
      "INT32, got 1.5");
  EXPECT_EQ(
      error(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [3], "data": [[1], [2]]}]})"),
      "input 'a': data has 2 elements, shape [3] has 3");
  EXPECT_EQ(
      error(
          R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [4294967296, 4294967296], "data": []}]})"),
      "input 'a': shape [4294967296,4294967296] has too many elements");
  EXPECT_EQ(error(R"({"parameters": {"timeout": -1}, "inputs": []})"),
            "parameter 'timeout' (microseconds) must be an integer >= 0, got -1");
  EXPECT_EQ(error(R"({"parameters": {"p": [1]}, "inputs": []})"),
            "parameter 'p' must be a boolean, a number or a string, got array");
  // The shared-memory parameters: the gRPC side's checks and messages (server/shm/tensor_params.h).
  EXPECT_EQ(
      error(
          R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}}]})"),
      "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
      "for tensor 'a'");
  EXPECT_EQ(
      error(
          R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1], "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]})"),
      "unexpected 'content' provided when using shared memory for input tensor 'a' for model "
      "'m'");
  EXPECT_EQ(
      error(
          R"({"inputs": [], "outputs": [{"name": "o", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 18446744073709551615}}]})"),
      "invalid value type for 'shared_memory_byte_size' parameter for tensor 'o', expected a "
      "JSON integer.");
  EXPECT_EQ(error("[1]"), "the request body must be a JSON object, got array");
  // nlohmann reports a number it cannot hold as out_of_range, not as a parse error.
  EXPECT_EQ(error(R"({"inputs": [1e999]})"),
            "the request body is not valid JSON: [json.exception.out_of_range.406] number overflow "
            "parsing '1e999'");
  EXPECT_EQ(error("{}"), "'inputs' is missing");
  EXPECT_EQ(error(R"({"inputs": [{"datatype": "FP32"}]})"), "inputs[0]: 'name' is missing");
}

TEST(KserveJson, RenderResponse) {
  api::InferResponse r;
  r.model_name = "m";
  r.model_version = "1";
  const std::vector<float> f = {0.5f, -1.25f};
  r.outputs.push_back(
      {"f", "FP32", {1, 2}, std::string(reinterpret_cast<const char*>(f.data()), 8)});
  r.outputs.push_back({"s", "BYTES", {2}, std::string("\x01\0\0\0a\x03\0\0\0bcd", 12)});
  r.outputs.push_back({"h", "FP16", {1}, std::string("\x00\x3e", 2)});
  r.outputs.push_back({"t", "BOOL", {2}, std::string("\x01\x00", 2)});
  http::OutputFormat json_only;
  auto out = http::render_infer_response(r, json_only);
  EXPECT_FALSE(out.header_length.has_value());
  EXPECT_EQ(json::parse(out.body), json::parse(R"({"model_name": "m", "model_version": "1",
      "outputs": [{"name": "f", "datatype": "FP32", "shape": [1, 2], "data": [0.5, -1.25]},
                  {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "bcd"]},
                  {"name": "h", "datatype": "FP16", "shape": [1], "data": [1.5]},
                  {"name": "t", "datatype": "BOOL", "shape": [2], "data": [true, false]}]})"));
  http::OutputFormat mixed;
  mixed.binary["s"] = true;
  out = http::render_infer_response(r, mixed);
  ASSERT_TRUE(out.header_length.has_value());
  const json h = json::parse(out.body.substr(0, *out.header_length));
  EXPECT_EQ(h["outputs"][1], json::parse(R"({"name": "s", "datatype": "BYTES", "shape": [2],
      "parameters": {"binary_data_size": 12}})"));
  EXPECT_EQ(out.body.substr(*out.header_length), std::string("\x01\0\0\0a\x03\0\0\0bcd", 12));

  r.outputs[0].data.resize(4);  // shape [1,2] of FP32 needs 8 bytes
  try {
    http::render_infer_response(r, json_only);
    ADD_FAILURE() << "no error";
  } catch (const api::Error& e) {
    EXPECT_EQ(e.code(), Code::internal);
    EXPECT_EQ(std::string(e.what()), "output 'f': 4 bytes for shape [1,2] of FP32");
  }
}

/// A non-finite float in a JSON `data` array is written as Triton writes it (rapidjson's
/// kWriteNanAndInfFlag: NaN, Infinity, -Infinity), not as nlohmann's `null`.
TEST(KserveJson, NonFiniteFloatsAreTritonTokens) {
  api::InferResponse r;
  r.model_name = "m";
  r.model_version = "1";
  r.id = "7";
  const std::vector<float> f = {std::nanf(""), INFINITY, -INFINITY, 0.5f};
  r.outputs.push_back(
      {"scores", "FP32", {2, 2}, std::string(reinterpret_cast<const char*>(f.data()), 16)});
  const std::vector<double> d = {-INFINITY, 2.0};
  r.outputs.push_back({"d", "FP64", {2}, std::string(reinterpret_cast<const char*>(d.data()), 16)});
  r.outputs.push_back({"h", "FP16", {2}, std::string("\x00\x7c\x00\x7e", 4)});  // +Inf, NaN
  const std::vector<std::int32_t> i = {3};
  r.outputs.push_back({"n", "INT32", {1}, std::string(reinterpret_cast<const char*>(i.data()), 4)});
  http::OutputFormat json_only;
  auto out = http::render_infer_response(r, json_only);
  EXPECT_EQ(out.body,
            "{\"id\":\"7\",\"model_name\":\"m\",\"model_version\":\"1\",\"outputs\":["
            "{\"data\":[NaN,Infinity,-Infinity,0.5],\"datatype\":\"FP32\",\"name\":\"scores\","
            "\"shape\":[2,2]},"
            "{\"data\":[-Infinity,2.0],\"datatype\":\"FP64\",\"name\":\"d\",\"shape\":[2]},"
            "{\"data\":[Infinity,NaN],\"datatype\":\"FP16\",\"name\":\"h\",\"shape\":[2]},"
            "{\"data\":[3],\"datatype\":\"INT32\",\"name\":\"n\",\"shape\":[1]}]}");
  // Binary outputs and outputs without a non-finite element are unchanged.
  http::OutputFormat mixed;
  mixed.binary["scores"] = true;
  out = http::render_infer_response(r, mixed);
  ASSERT_TRUE(out.header_length.has_value());
  EXPECT_EQ(out.body.substr(0, *out.header_length),
            "{\"id\":\"7\",\"model_name\":\"m\",\"model_version\":\"1\",\"outputs\":["
            "{\"datatype\":\"FP32\",\"name\":\"scores\",\"parameters\":{\"binary_data_size\":16},"
            "\"shape\":[2,2]},"
            "{\"data\":[-Infinity,2.0],\"datatype\":\"FP64\",\"name\":\"d\",\"shape\":[2]},"
            "{\"data\":[Infinity,NaN],\"datatype\":\"FP16\",\"name\":\"h\",\"shape\":[2]},"
            "{\"data\":[3],\"datatype\":\"INT32\",\"name\":\"n\",\"shape\":[1]}]}");
  EXPECT_EQ(out.body.substr(*out.header_length), r.outputs[0].data);
}

TEST(KserveJson, StatusMappingAndErrorBody) {
  EXPECT_EQ(http::http_status(Code::invalid_argument), 400);
  EXPECT_EQ(http::http_status(Code::not_found), 404);
  EXPECT_EQ(http::http_status(Code::unavailable), 503);
  EXPECT_EQ(http::http_status(Code::internal), 500);
  EXPECT_EQ(http::http_status(Code::resource_exhausted), 429);
  EXPECT_EQ(http::http_status(Code::deadline_exceeded), 504);
  EXPECT_EQ(http::http_status(Code::permission_denied), 403);
  EXPECT_EQ(http::http_status(Code::cancelled), 400);
  EXPECT_EQ(http::http_status(Code::already_exists), 400);  // Triton's HttpCodeFromError
  EXPECT_EQ(http::http_status(Code::unimplemented), 501);
  EXPECT_EQ(http::render_error("a \"b\""), "{\"error\":\"a \\\"b\\\"\"}");
  const std::string clipped = json::parse(http::render_error(std::string(5000, 'x')))["error"];
  EXPECT_EQ(clipped, std::string(2048, 'x') + "... (5000 bytes, clipped)");
}

}  // namespace
}  // namespace libreyolo::server
