// Triton's shared-memory extensions over KServe v2 REST against the daemon in process (fake
// detector): register / status / unregister of system regions with Triton's JSON and the gRPC
// side's messages mapped to HTTP statuses, CUDA registration without a device, inputs read from
// a region and outputs written into one (reported with `parameters` naming the region and no
// data), every parameter and bounds error, and one registry for both transports (a region
// registered over gRPC is used over REST and the converse).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

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

/// PosixShm (server_test_support.h) named apart from server_shm_test.cpp's objects.
class ShmObject : public PosixShm {
 public:
  ShmObject(const std::string& tag, std::size_t bytes)
      : PosixShm(tag, bytes, "/libreyolo_httptest_") {}
};

/// RFC 4648 base64, as tritonclient.http encodes a CUDA IPC handle.
std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const auto n = (std::uint32_t(std::uint8_t(bytes[i])) << 16) |
                   (std::uint32_t(std::uint8_t(bytes[i + 1])) << 8) | std::uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += abc[(n >> s) & 63];
  }
  if (i + 1 == bytes.size()) {
    const auto n = std::uint32_t(std::uint8_t(bytes[i])) << 16;
    out += std::string{abc[(n >> 18) & 63], abc[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const auto n = (std::uint32_t(std::uint8_t(bytes[i])) << 16) |
                   (std::uint32_t(std::uint8_t(bytes[i + 1])) << 8);
    out += std::string{abc[(n >> 18) & 63], abc[(n >> 12) & 63], abc[(n >> 6) & 63], '='};
  }
  return out;
}

constexpr std::size_t kPixelBytes = 3 * 8 * 8 * 4;     // one 8x8 image, FP32
const float kScore = 1.0f / (1.0f + std::exp(-2.0f));  // the fake's sigmoid(2)

json shm_params(const std::string& region, std::int64_t offset, std::int64_t bytes) {
  return {{"shared_memory_region", region},
          {"shared_memory_offset", offset},
          {"shared_memory_byte_size", bytes}};
}

/// pixel_values [1,3,8,8] with input parameters `params`; `outputs` as given.
json infer_body(const json& params,
                const json& outputs = json::array({{{"name", "num_detections"}}})) {
  return {{"inputs",
           {{{"name", "pixel_values"},
             {"datatype", "FP32"},
             {"shape", {1, 3, 8, 8}},
             {"parameters", params}}}},
          {"outputs", outputs}};
}

std::string error_of(const HttpExchange& r) {
  try {
    return json::parse(r.body).at("error").get<std::string>();
  } catch (const std::exception&) {
    return "(no error body: " + r.body + ")";
  }
}

class HttpShm : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeState::get().reset();
    repo_ = temp_dir("http_shm");
    add_fake_model(repo_, "fake", "max_batch_size: 4\nmax_queue_delay_microseconds: 0\n");
    daemon_ = std::make_unique<Daemon>(loopback_config(repo_), fake_or_real());
    daemon_->start();
    FakeState::get().reset();  // forget the warm-up forward
    grpc_ = std::make_unique<rpc::Client>("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  void TearDown() override {
    grpc_.reset();
    daemon_.reset();
    FakeState::get().reset();
    remove_tree(repo_);
  }
  int port() const { return daemon_->http_port(); }
  HttpExchange get(const std::string& path) { return http_request(port(), "GET", path); }
  HttpExchange post(const std::string& path, const std::string& body = "") {
    return http_request(port(), "POST", path, body);
  }
  HttpExchange register_system(const std::string& name, const std::string& key,
                               std::uint64_t offset, std::uint64_t bytes) {
    return post("/v2/systemsharedmemory/region/" + name + "/register",
                json{{"key", key}, {"offset", offset}, {"byte_size", bytes}}.dump());
  }
  HttpExchange infer(const json& body) { return post("/v2/models/fake/infer", body.dump()); }

  fs::path repo_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<rpc::Client> grpc_;
};

// ---- register / status / unregister --------------------------------------------------------

TEST_F(HttpShm, SystemRegisterStatusUnregister) {
  ShmObject obj("status", 4096);
  auto r = register_system("in", obj.key(), 100, 1000);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "");
  const std::string entry =
      "{\"byte_size\":1000,\"key\":\"" + obj.key() + "\",\"name\":\"in\",\"offset\":100}";
  r = get("/v2/systemsharedmemory/status");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(r.body, "[" + entry + "]");
  r = get("/v2/systemsharedmemory/region/in/status");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "[" + entry + "]");

  // The gRPC side's codes and messages, as HTTP statuses (server/http/kserve_json.h
  // http_status: ALREADY_EXISTS and INVALID_ARGUMENT 400, NOT_FOUND 404).
  struct Case {
    HttpExchange reply;
    int status;
    std::string error;
  };
  const std::vector<Case> cases = {
      {register_system("in", obj.key(), 0, 16), 400,
       "shared memory region 'in' already in manager"},
      {register_system("missing", "/libreyolo_no_such_key", 0, 16), 404,
       "Unable to open shared memory region: '/libreyolo_no_such_key': No such file or "
       "directory"},
      {register_system("big", obj.key(), 4000, 200), 400,
       "failed to register shared memory region 'big': invalid args (offset 4000 + byte_size 200 "
       "must be within the 4096 bytes of shared memory key '" +
           obj.key() + "')"},
      {get("/v2/systemsharedmemory/region/nope/status"), 404,
       "Unable to find system shared memory region: 'nope'"},
      {get("/v2/cudasharedmemory/region/in/status"), 404,
       "The region named 'in' is registered as system shared memory, not CUDA shared memory"},
      {get("/v2/cudasharedmemory/region/nope/status"), 404,
       "Unable to find cuda shared memory region: 'nope'"},
      {post("/v2/systemsharedmemory/region/x/register", R"({"offset": 0, "byte_size": 16})"), 400,
       "the register request body: 'key' is missing"},
      {post("/v2/systemsharedmemory/region/x/register", R"({"key": "/k"})"), 400,
       "the register request body: 'byte_size' is missing"},
      {post("/v2/systemsharedmemory/region/x/register", R"({"key": "/k", "byte_size": -1})"), 400,
       "the register request body: 'byte_size' must be an integer >= 0, got -1"},
      {post("/v2/systemsharedmemory/region/x/register", "[1]"), 400,
       "the register request body must be a JSON object, got array"},
      {get("/v2/systemsharedmemory/region/x/register"), 405,
       "GET /v2/systemsharedmemory/region/x/register: use POST"},
      {post("/v2/systemsharedmemory/register", "{}"), 404,
       "not found: /v2/systemsharedmemory/register"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.reply.status, c.status) << c.error << ": " << c.reply.body;
    EXPECT_EQ(error_of(c.reply), c.error);
  }
  r = get("/v2/cudasharedmemory/status");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "[]");

  // Unknown names and the other kind are no error (Triton); the region stays.
  r = post("/v2/systemsharedmemory/region/nope/unregister");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(post("/v2/cudasharedmemory/region/in/unregister").status, 200);
  EXPECT_EQ(get("/v2/systemsharedmemory/status").body, "[" + entry + "]");
  EXPECT_EQ(register_system("in2", obj.key(), 0, 4096).status, 200);
  EXPECT_EQ(post("/v2/systemsharedmemory/region/in/unregister").status, 200);
  EXPECT_EQ(get("/v2/systemsharedmemory/status").body,
            "[{\"byte_size\":4096,\"key\":\"" + obj.key() + "\",\"name\":\"in2\",\"offset\":0}]");
  EXPECT_EQ(post("/v2/systemsharedmemory/unregister").status, 200);  // every system region
  EXPECT_EQ(get("/v2/systemsharedmemory/status").body, "[]");
  // offset may be left out (0), and a name is free again once unregistered.
  r = post("/v2/systemsharedmemory/region/in/register",
           json{{"key", obj.key()}, {"byte_size", 16}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(get("/v2/systemsharedmemory/region/in/status").body,
            "[{\"byte_size\":16,\"key\":\"" + obj.key() + "\",\"name\":\"in\",\"offset\":0}]");
}

TEST_F(HttpShm, ServerMetadataListsTheExtensions) {
  const auto r = get("/v2");
  ASSERT_EQ(r.status, 200);
  const auto ext = json::parse(r.body)["extensions"].get<std::vector<std::string>>();
  EXPECT_EQ(std::count(ext.begin(), ext.end(), "system_shared_memory"), 1) << r.body;
  EXPECT_EQ(std::count(ext.begin(), ext.end(), "cuda_shared_memory"),
            shm::Registry::cuda_built() ? 1 : 0)
      << r.body;
}

/// CUDA registration over REST: the body's errors name the field; a handle of the wrong size is
/// the registry's 400; a well-formed one without a device (or CUDA build) is 503 saying why.
TEST_F(HttpShm, CudaRegisterWithoutADevice) {
  const std::string path = "/v2/cudasharedmemory/region/g/register";
  auto r = post(path, R"({"raw_handle": {"b64": "YWJj"}, "device_id": 0, "byte_size": 16})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r),
            "failed to register CUDA shared memory region 'g': raw_handle has 3 bytes, expected "
            "64 (a cudaIpcMemHandle_t)");
  r = post(path, R"({"raw_handle": {"b64": "a*b="}, "device_id": 0, "byte_size": 16})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r), "the register request body: raw_handle.b64 is not base64");
  r = post(path, R"({"raw_handle": "abc", "device_id": 0, "byte_size": 16})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r),
            "the register request body: 'raw_handle' must be an object {\"b64\": \"...\"}, got "
            "string");
  r = post(path, R"({"raw_handle": {"b64": "YWJj"}, "byte_size": 16})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r), "the register request body: 'device_id' is missing");

  const json body = {{"raw_handle", {{"b64", base64(std::string(64, '\0'))}}},
                     {"device_id", 0},
                     {"byte_size", 16}};
  r = post(path, body.dump());
  if (!shm::Registry::cuda_built()) {
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(error_of(r),
              "CUDA shared memory is not available: this libreyolo-server was built without CUDA");
  } else if (r.status == 503) {  // a CUDA build on a machine without a device
    EXPECT_EQ(error_of(r).rfind("CUDA shared memory is not available: no CUDA device (", 0), 0u)
        << r.body;
  } else {  // a device: a handle of zeros opens nothing
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(error_of(r).rfind("failed to register shared memory region: invalid args", 0), 0u)
        << r.body;
  }
  EXPECT_EQ(get("/v2/cudasharedmemory/status").body, "[]");
}

// ---- inference through shared memory -------------------------------------------------------

/// pixel_values read from a region at an offset that is not page-aligned; scores and boxes
/// written into another region and reported with parameters naming it (no data), labels and
/// num_detections in the JSON as usual.
TEST_F(HttpShm, InputFromARegionOutputsIntoARegion) {
  ShmObject in("in", 8192), out("out", 4096);
  float* pixels = reinterpret_cast<float*>(in.data() + 300 + 12);
  double want_sum = 0;
  for (std::size_t i = 0; i < kPixelBytes / 4; ++i) {
    pixels[i] = 0.25f * static_cast<float>(i % 7);
    want_sum += pixels[i];
  }
  ASSERT_EQ(register_system("in", in.key(), 300, 4000).status, 200);
  ASSERT_EQ(register_system("out", out.key(), 0, 4096).status, 200);
  const json outputs = {{{"name", "scores"}, {"parameters", shm_params("out", 0, 16)}},
                        {{"name", "labels"}},
                        {{"name", "boxes"}, {"parameters", shm_params("out", 64, 64)}},
                        {{"name", "num_detections"}}};
  const auto r = infer(infer_body(shm_params("in", 12, kPixelBytes), outputs));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(FakeState::get().sums(), std::vector<double>{want_sum});
  const json j = json::parse(r.body);
  std::map<std::string, json> by_name;
  for (const auto& o : j["outputs"]) by_name[o["name"]] = o;
  ASSERT_EQ(by_name.size(), 4u) << r.body;
  EXPECT_EQ(by_name["scores"], json::parse(R"({"name": "scores", "datatype": "FP32",
      "shape": [1, 4], "parameters": {"shared_memory_region": "out",
      "shared_memory_byte_size": 16}})"));
  EXPECT_EQ(by_name["boxes"], json::parse(R"({"name": "boxes", "datatype": "FP32",
      "shape": [1, 4, 4], "parameters": {"shared_memory_region": "out",
      "shared_memory_byte_size": 64, "shared_memory_offset": 64}})"));
  EXPECT_EQ(by_name["num_detections"]["data"], json::parse("[4]"));
  EXPECT_EQ(by_name["labels"]["data"].size(), 4u);
  const auto* scores = reinterpret_cast<const float*>(out.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(scores[i], kScore, 1e-6f) << i;
  // Query q's box is (0.2q + 0.15, 0.4, 0.2q + 0.25, 0.6) * 8: every y0 is 3.2, every y1 4.8.
  const auto* boxes = reinterpret_cast<const float*>(out.data() + 64);
  for (int q = 0; q < 4; ++q) {
    EXPECT_NEAR(boxes[q * 4 + 1], 3.2f, 1e-4f) << q;
    EXPECT_NEAR(boxes[q * 4 + 3], 4.8f, 1e-4f) << q;
  }
  EXPECT_EQ(out.data()[16], 0) << "wrote past the 16 bytes of scores";
  // Binary outputs alongside: the shared-memory one still has no data.
  const json bin = {{{"name", "scores"}, {"parameters", shm_params("out", 0, 16)}},
                    {{"name", "num_detections"}, {"parameters", {{"binary_data", true}}}}};
  const auto b = infer(infer_body(shm_params("in", 12, kPixelBytes), bin));
  ASSERT_EQ(b.status, 200) << b.body;
  const std::size_t n = std::stoul(b.header("inference-header-content-length"));
  EXPECT_EQ(b.body.size(), n + 4);  // only num_detections' INT32
}

/// Every parameter and bounds error of an input, with its status and the gRPC side's message
/// (server/shm/tensor_params.h); none reaches the model.
TEST_F(HttpShm, InputErrorsNameTheTensorAndTheRegion) {
  ShmObject in("bounds", 4096);
  ASSERT_EQ(register_system("in", in.key(), 0, 1024).status, 200);
  struct Case {
    json params;
    int status;
    std::string error;
    json data = nullptr;
  };
  const std::vector<Case> cases = {
      {shm_params("zz", 0, kPixelBytes), 404, "Unable to find shared memory region: 'zz'"},
      {shm_params("in", 1024, 4), 400,
       "Invalid offset for shared memory region: 'in' (offset 1024, region of 1024 bytes)"},
      {shm_params("in", 512, kPixelBytes), 400,
       "Invalid offset + byte size for shared memory region: 'in' (offset 512 + byte_size 768 > "
       "1024 bytes)"},
      {shm_params("in", 0, 700), 400,
       "input 'pixel_values': shape [1,3,8,8] needs 768 bytes of FP32, got 700"},
      {shm_params("in", -4, 16), 400,
       "tensor 'pixel_values': 'shared_memory_offset' must not be negative, got -4"},
      {{{"shared_memory_region", "in"}},
       400,
       "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
       "for tensor 'pixel_values'"},
      {{{"shared_memory_region", 1}, {"shared_memory_byte_size", 768}},
       400,
       "invalid value type for 'shared_memory_region' parameter for tensor 'pixel_values', "
       "expected a JSON string."},
      {{{"shared_memory_region", "in"}, {"shared_memory_byte_size", 768.0}},
       400,
       "invalid value type for 'shared_memory_byte_size' parameter for tensor 'pixel_values', "
       "expected a JSON integer."},
      {{{"shared_memory_offset", 0}},
       400,
       "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
       "for tensor 'pixel_values'"},
      {shm_params("in", 0, kPixelBytes), 400,
       "unexpected 'content' provided when using shared memory for input tensor 'pixel_values' "
       "for model 'fake'",
       json::array({1})},
  };
  for (const auto& c : cases) {
    json body = infer_body(c.params);
    if (!c.data.is_null()) body["inputs"][0]["data"] = c.data;
    const auto r = infer(body);
    EXPECT_EQ(r.status, c.status) << c.params.dump() << ": " << r.body;
    EXPECT_EQ(error_of(r), c.error) << c.params.dump();
  }
  EXPECT_TRUE(FakeState::get().batches().empty());
  EXPECT_EQ(infer(infer_body(shm_params("in", 0, kPixelBytes))).status, 200);
}

/// An output larger than its region: 400 naming the output, the region and both sizes, nothing
/// written; an output region that is unknown or out of bounds fails before the model runs.
TEST_F(HttpShm, OutputLargerThanItsRegionIsAnError) {
  ShmObject in("oin", 4096), out("osmall", 4096);
  std::memset(out.data(), 0x7f, 64);
  ASSERT_EQ(register_system("in", in.key(), 0, kPixelBytes).status, 200);
  ASSERT_EQ(register_system("out", out.key(), 0, 64).status, 200);
  const json pixels = shm_params("in", 0, kPixelBytes);
  auto r = infer(infer_body(
      pixels, json::array({{{"name", "scores"}, {"parameters", shm_params("out", 0, 8)}}})));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r),
            "shared memory size specified with the request for output 'scores' (8 bytes, region "
            "'out') should be at least 16 bytes to hold the results");
  EXPECT_EQ(out.data()[0], 0x7f) << "a failed call wrote into the region";
  EXPECT_EQ(FakeState::get().batches().size(), 1u);
  r = infer(infer_body(
      pixels, json::array({{{"name", "scores"}, {"parameters", shm_params("gone", 0, 8)}}})));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r), "Unable to find shared memory region: 'gone'");
  r = infer(infer_body(
      pixels, json::array({{{"name", "scores"}, {"parameters", shm_params("out", 60, 16)}}})));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r),
            "Invalid offset + byte size for shared memory region: 'out' (offset 60 + byte_size 16 "
            "> 64 bytes)");
  EXPECT_EQ(FakeState::get().batches().size(), 1u) << "a bad output region reached the model";
}

// ---- one registry for both transports ---------------------------------------------------------

/// A region registered over gRPC is listed and used over REST, one registered over REST is
/// listed and used over gRPC, and an unregister over either transport ends it for both.
TEST_F(HttpShm, OneRegistryForBothTransports) {
  ShmObject in("xin", 4096), out("xout", 4096);
  for (std::size_t i = 0; i < kPixelBytes / 4; ++i) reinterpret_cast<float*>(in.data())[i] = 1.0f;
  auto g = grpc_->call("SystemSharedMemoryRegister",
                       "name: \"in\" key: \"" + in.key() + "\" byte_size: 4096");
  ASSERT_TRUE(g.ok()) << g.message;
  EXPECT_EQ(get("/v2/systemsharedmemory/status").body,
            "[{\"byte_size\":4096,\"key\":\"" + in.key() + "\",\"name\":\"in\",\"offset\":0}]");
  ASSERT_EQ(register_system("out", out.key(), 0, 4096).status, 200);
  g = grpc_->call("SystemSharedMemoryStatus", "name: \"out\"");
  ASSERT_TRUE(g.ok()) << g.message;
  EXPECT_EQ(g.text, "regions {\n  key: \"out\"\n  value {\n    name: \"out\"\n    key: \"" +
                        out.key() + "\"\n    byte_size: 4096\n  }\n}\n");
  // Registering a name the other transport took is ALREADY_EXISTS there too.
  g = grpc_->call("SystemSharedMemoryRegister",
                  "name: \"out\" key: \"" + out.key() + "\" byte_size: 16");
  EXPECT_EQ(g.code, Code::already_exists);
  EXPECT_EQ(g.message, "shared memory region 'out' already in manager");
  auto h = register_system("in", in.key(), 0, 16);
  EXPECT_EQ(h.status, 400);
  EXPECT_EQ(error_of(h), "shared memory region 'in' already in manager");

  // REST reads the gRPC-registered input and writes into the REST-registered output.
  auto r = infer(
      infer_body(shm_params("in", 0, kPixelBytes),
                 json::array({{{"name", "scores"}, {"parameters", shm_params("out", 0, 16)}}})));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(FakeState::get().sums(), std::vector<double>{192.0});
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(reinterpret_cast<const float*>(out.data())[i], kScore, 1e-6f) << i;
  // gRPC writes into the REST-registered output at another offset.
  const auto res = grpc_->infer(
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, "
      "8] parameters { key: \"shared_memory_region\" value { string_param: \"in\" } } parameters "
      "{ key: \"shared_memory_byte_size\" value { int64_param: 768 } } } outputs { name: "
      "\"scores\" parameters { key: \"shared_memory_region\" value { string_param: \"out\" } } "
      "parameters { key: \"shared_memory_offset\" value { int64_param: 32 } } parameters { key: "
      "\"shared_memory_byte_size\" value { int64_param: 16 } } }");
  ASSERT_TRUE(res.ok()) << res.message;
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(reinterpret_cast<const float*>(out.data() + 32)[i], kScore, 1e-6f) << i;

  // Unregister over REST: gone for gRPC; over gRPC: gone for REST.
  EXPECT_EQ(post("/v2/systemsharedmemory/region/in/unregister").status, 200);
  g = grpc_->call("SystemSharedMemoryStatus", "name: \"in\"");
  EXPECT_EQ(g.code, Code::not_found);
  EXPECT_EQ(g.message, "Unable to find system shared memory region: 'in'");
  EXPECT_TRUE(grpc_->call("SystemSharedMemoryUnregister", "").ok());
  EXPECT_EQ(get("/v2/systemsharedmemory/status").body, "[]");
  r = infer(infer_body(shm_params("out", 0, kPixelBytes)));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r), "Unable to find shared memory region: 'out'");
}

// ---- the codec's parts (server/http/kserve_json.h) --------------------------------------------

TEST(KserveJsonShm, Base64AndRegisterBodies) {
  EXPECT_EQ(http::base64_decode("YWJj"), std::optional<std::string>("abc"));
  EXPECT_EQ(http::base64_decode("YWI="), std::optional<std::string>("ab"));
  EXPECT_EQ(http::base64_decode("YQ"), std::optional<std::string>("a"));  // padding optional
  EXPECT_EQ(http::base64_decode(""), std::optional<std::string>(""));
  EXPECT_EQ(http::base64_decode("Y"), std::nullopt);
  EXPECT_EQ(http::base64_decode("a*b="), std::nullopt);
  const std::string handle(64, '\x5a');
  EXPECT_EQ(http::base64_decode(base64(handle)), std::optional<std::string>(handle));

  const auto sys = http::parse_system_register(R"({"key": "/k", "byte_size": 16})");
  EXPECT_EQ(sys.key, "/k");
  EXPECT_EQ(sys.offset, 0u);
  EXPECT_EQ(sys.byte_size, 16u);
  const auto cuda = http::parse_cuda_register(
      R"({"raw_handle": {"b64": "YWJj"}, "device_id": 1, "byte_size": 32})");
  EXPECT_EQ(cuda.raw_handle, "abc");
  EXPECT_EQ(cuda.device_id, 1);
  EXPECT_EQ(cuda.byte_size, 32u);
  EXPECT_EQ(http::render_cuda_status({{"g", 0, 16}}),
            "[{\"byte_size\":16,\"device_id\":0,\"name\":\"g\"}]");
}

}  // namespace
}  // namespace libreyolo::server
