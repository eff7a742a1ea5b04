// The daemon in process on loopback ports, driven by a real gRPC client: every RPC, the
// fixture detections, health states, bad-input statuses, queue overflow, deadlines, batching,
// the HTTP admin port and the drain.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <future>
#include <mutex>
#include <set>

#include "kernels/registry.h"
#include "log/log.h"
#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/grpc/log_limiter.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

ServerConfig test_config(const fs::path& repo, int64_t max_message_bytes = 16 << 20) {
  auto c = loopback_config(repo);
  c.max_message_bytes.value = max_message_bytes;
  return c;
}

std::string images_request(const std::string& model, int64_t n, const std::string& extra = "") {
  return "model_name: \"" + model +
         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " + std::to_string(n) + " } " +
         extra;
}

class ServerGrpc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("repo"));
    add_rtdetr_tiny(*repo_, "warmup: false\n");  // its first forward (1-2 s) only where it is used
    add_fake_model(*repo_, "fake", "max_batch_size: 1\nmax_queue_size: 2\n");
    add_fake_model(*repo_, "fake_batching",
                   "max_batch_size: 4\nmax_queue_delay_microseconds: 1000000\nmax_queue_size: 16\n"
                   "refill_wait_fraction: 0.25\n");
    daemon_ = new Daemon(test_config(*repo_), fake_or_real());
    daemon_->start();
    address_ = new std::string("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  static void TearDownTestSuite() {
    delete daemon_;
    remove_tree(*repo_);
    delete repo_;
    delete address_;
  }
  void SetUp() override { FakeState::get().reset(); }

  static fs::path* repo_;
  static Daemon* daemon_;
  static std::string* address_;
};
fs::path* ServerGrpc::repo_ = nullptr;
Daemon* ServerGrpc::daemon_ = nullptr;
std::string* ServerGrpc::address_ = nullptr;

TEST_F(ServerGrpc, LivenessReadinessAndMetadata) {
  rpc::Client c(*address_);
  auto r = c.call("ServerLive");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.text, "live: true\n");
  r = c.call("ServerReady");
  EXPECT_EQ(r.text, "ready: true\n");
  r = c.call("ServerMetadata");
  EXPECT_NE(r.text.find("name: \"libreyolo-server\""), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("extensions: \"statistics\""), std::string::npos) << r.text;
  r = c.call("ModelReady", "name: \"rtdetr_tiny\"");
  EXPECT_EQ(r.text, "ready: true\n");
  r = c.call("ModelReady", "name: \"rtdetr_tiny\" version: \"1\"");
  EXPECT_EQ(r.text, "ready: true\n");
  r = c.call("ModelReady", "name: \"nope\"");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.text, "");  // ready: false is the default value, printed as nothing
}

TEST_F(ServerGrpc, HealthService) {
  rpc::Client c(*address_);
  for (const char* s : {"", "liveness", "readiness"}) {
    auto r = c.health(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.message;
    EXPECT_EQ(r.text, "SERVING") << s;
  }
  EXPECT_EQ(c.health("no-such-service").code, Code::not_found);
}

TEST_F(ServerGrpc, ModelMetadataConfigStatisticsIndex) {
  rpc::Client c(*address_);
  auto r = c.call("ModelMetadata", "name: \"rtdetr_tiny\"");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("platform: \"libreyolo_rt_detr\""), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("name: \"images\"\n  datatype: \"BYTES\"\n  shape: -1"), std::string::npos)
      << r.text;
  EXPECT_NE(
      r.text.find("name: \"logits\"\n  datatype: \"FP32\"\n  shape: -1\n  shape: 30\n  shape: 10"),
      std::string::npos)
      << r.text;
  r = c.call("ModelMetadata", "name: \"nope\"");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "unknown model 'nope'");
  r = c.call("ModelMetadata", "name: \"rtdetr_tiny\" version: \"7\"");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_NE(r.message.find("has no version '7'"), std::string::npos);

  r = c.call("ModelConfig", "name: \"fake_batching\"");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("max_batch_size: 4\n"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("max_queue_delay_microseconds: 1000000"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("max_queue_size: 16"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("key: \"refill_wait_fraction\"\n    value {\n      string_value: \"0.25\""),
            std::string::npos)
      << r.text;
  r = c.call("ModelConfig", "name: \"fake\"");  // the default
  EXPECT_NE(r.text.find("key: \"refill_wait_fraction\"\n    value {\n      string_value: \"0.1\""),
            std::string::npos)
      << r.text;

  r = c.call("RepositoryIndex");
  ASSERT_TRUE(r.ok());
  for (const char* m : {"fake", "fake_batching", "rtdetr_tiny"}) {
    EXPECT_NE(r.text.find(std::string("name: \"") + m + "\"\n  version: \"1\"\n  state: \"READY\""),
              std::string::npos)
        << r.text;
  }
  r = c.call("RepositoryModelLoad", "model_name: \"fake\"");
  EXPECT_EQ(r.code, Code::permission_denied);
  EXPECT_NE(r.message.find("model_control: none"), std::string::npos) << r.message;
  r = c.call("RepositoryModelUnload", "model_name: \"fake\"");
  EXPECT_EQ(r.code, Code::permission_denied);

  auto before = c.call("ModelStatistics", "name: \"fake\"");
  ASSERT_TRUE(before.ok()) << before.message;
  auto ok = c.infer(images_request("fake", 1),
                    {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})});
  ASSERT_TRUE(ok.ok()) << ok.message;
  auto after = c.call("ModelStatistics", "name: \"fake\"");
  EXPECT_NE(after.text.find("batch_size: 1"), std::string::npos) << after.text;
  EXPECT_NE(after.text.find("inference_count:"), std::string::npos) << after.text;
  EXPECT_EQ(c.call("ModelStatistics", "name: \"nope\"").code, Code::not_found);
}

/// The fixture photographs through the real RT-DETR (random weights) against transformers'
/// post_process_object_detection at threshold 0.3.
TEST_F(ServerGrpc, DetectionsMatchTheFixture) {
  rpc::Client c(*address_, 64 << 20);
  const auto expected =
      models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
  const std::vector<std::string> jpegs = {read_file(kFixtures + "/images/astronaut.jpg"),
                                          read_file(kFixtures + "/images/coffee.jpg")};
  auto check = [&](const rpc::InferResult& r, double score_tol, double box_tol, const char* what) {
    ASSERT_TRUE(r.ok()) << what << ": " << r.message;
    EXPECT_EQ(r.model_name, "rtdetr_tiny");
    EXPECT_EQ(r.model_version, "1");
    const auto counts = values<int32_t>(r.output("num_detections").data);
    ASSERT_EQ(counts.size(), 2u);
    const auto& scores_t = r.output("scores");
    const int64_t k = scores_t.shape.at(1);
    const auto scores = values<float>(scores_t.data);
    const auto labels = values<int64_t>(r.output("labels").data);
    const auto boxes = values<float>(r.output("boxes").data);
    const auto names = r.output("label_names");
    EXPECT_EQ(names.datatype, "BYTES");
    double max_score = 0, max_box = 0;
    int label_mismatch = 0;
    for (int i = 0; i < 2; ++i) {
      const std::string p = "th0.3_img" + std::to_string(i) + "_";
      auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      auto el = expected->get(p + "labels", at::kLong, at::kCPU);
      auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      ASSERT_EQ(counts[i], es.size(0)) << what << " image " << i;
      for (int64_t j = 0; j < counts[i]; ++j) {
        max_score = std::max(max_score, std::abs(double(scores[i * k + j]) - es[j].item<float>()));
        label_mismatch += labels[i * k + j] != el[j].item<int64_t>();
        for (int q = 0; q < 4; ++q) {
          max_box = std::max(max_box,
                             std::abs(double(boxes[(i * k + j) * 4 + q]) - eb[j][q].item<float>()));
        }
      }
    }
    std::cout << what << ": max |score - expected| = " << max_score
              << ", max |box - expected| = " << max_box << " px, label mismatches "
              << label_mismatch << "\n";
    EXPECT_LE(max_score, score_tol) << what;
    EXPECT_LE(max_box, box_tol) << what;
    EXPECT_EQ(label_mismatch, 0) << what;
  };
  const std::string th = "parameters { key: \"threshold\" value { double_param: 0.3 } }";
  // Encoded JPEGs, raw contents: decode + resize in C++ differ slightly from PIL + torchvision.
  check(c.infer(images_request("rtdetr_tiny", 2, th), {rpc::pack_bytes(jpegs)}), 2e-2, 2.0,
        "images raw");
  // The same as typed bytes_contents.
  check(
      c.infer("model_name: \"rtdetr_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 "
              "contents { bytes_contents: \"" +
              rpc::text_escape(jpegs[0]) + "\" bytes_contents: \"" + rpc::text_escape(jpegs[1]) +
              "\" } } " + th),
      2e-2, 2.0, "images typed");
  // The fixture's own pixels as pixel_values with target_sizes: the model alone.
  auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU);
  auto pv = (u8 * static_cast<float>(0.00392156862745098)).contiguous();
  std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
  std::vector<int64_t> sizes = {512, 512, 400, 600};
  std::string raw_sizes(reinterpret_cast<const char*>(sizes.data()), sizes.size() * 8);
  check(c.infer("model_name: \"rtdetr_tiny\" inputs { name: \"pixel_values\" datatype: \"FP32\" "
                "shape: [2, 3, 640, 640] } "
                "inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [2, 2] } " +
                    th,
                {raw, raw_sizes}),
        1e-4, 1e-2, "pixel_values");
}

// libreyolo-client detect --out: the photograph with every detection's box drawn on it, 3 pixels
// wide, in its label's colour (tools/client/overlay.h): only pixels of the box outlines change,
// and the last box drawn keeps its colour at its top-left corner.
TEST_F(ServerGrpc, ClientDetectWritesTheBoxes) {
  const auto dir = temp_dir("boxes");
  const std::string photo = kFixtures + "/images/coffee.jpg";
  const std::string png = (dir / "boxes.png").string(), log = (dir / "log.txt").string();
  const std::string cmd = std::string(LIBREYOLO_BINARY_DIR) +
                          "/bin/libreyolo-client detect --model rtdetr_tiny --threshold 0.3 "
                          "--image " +
                          photo + " --out " + png + " --server " + *address_ + " > " + log +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
  // The same request from the test: the boxes the client drew.
  rpc::Client c(*address_, 64 << 20);
  const auto r =
      c.infer(images_request("rtdetr_tiny", 1,
                             "parameters { key: \"threshold\" value { double_param: 0.3 } }"),
              {rpc::pack_bytes({read_file(photo)})});
  ASSERT_TRUE(r.ok()) << r.message;
  const int32_t n = values<int32_t>(r.output("num_detections").data).at(0);
  const auto boxes = values<float>(r.output("boxes").data);
  const auto labels = values<int64_t>(r.output("labels").data);
  // The fixture's post-processing of coffee.jpg (image 1) at threshold 0.3.
  const auto expected =
      models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
  ASSERT_EQ(n, expected->get("th0.3_img1_scores", at::kFloat, at::kCPU).size(0));
  const std::string printed = read_file(log);
  EXPECT_NE(
      printed.find(photo + ": " + std::to_string(n) + " detections (model rtdetr_tiny version 1)"),
      std::string::npos)
      << printed;
  EXPECT_NE(printed.find("wrote " + png + " (" + std::to_string(n) + " boxes over " + photo + ")"),
            std::string::npos)
      << printed;

  const std::string jpg = read_file(photo), out = read_file(png);
  const auto before = image::decode_rgb(reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size());
  const auto after = image::decode_rgb(reinterpret_cast<const uint8_t*>(out.data()), out.size());
  ASSERT_EQ(after.height, before.height);
  ASSERT_EQ(after.width, before.width);
  const int64_t w = before.width, h = before.height;
  auto on_an_outline = [&](int64_t x, int64_t y) {
    for (int32_t j = 0; j < n; ++j) {
      const float* b = &boxes[j * 4];
      const int64_t x0 = std::max<int64_t>(0, std::floor(b[0])),
                    y0 = std::max<int64_t>(0, std::floor(b[1]));
      const int64_t x1 = std::min<int64_t>(w - 1, int64_t(std::ceil(b[2])) - 1),
                    y1 = std::min<int64_t>(h - 1, int64_t(std::ceil(b[3])) - 1);
      if (x < x0 || x > x1 || y < y0 || y > y1) continue;
      if (x - x0 < 3 || x1 - x < 3 || y - y0 < 3 || y1 - y < 3) return true;
    }
    return false;
  };
  int64_t changed = 0, changed_elsewhere = 0;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const int64_t p = (y * w + x) * 3;
      if (before.rgb[p] == after.rgb[p] && before.rgb[p + 1] == after.rgb[p + 1] &&
          before.rgb[p + 2] == after.rgb[p + 2])
        continue;
      ++changed;
      changed_elsewhere += !on_an_outline(x, y);
    }
  EXPECT_GT(changed, 0);
  EXPECT_EQ(changed_elsewhere, 0);
  // Tableau 10, the client's palette: the last box's top-left corner is drawn last.
  const uint8_t palette[10][3] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                  {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                  {188, 189, 34},  {23, 190, 207}};
  ASSERT_GT(n, 0);
  const float* last = &boxes[(n - 1) * 4];
  const int64_t cx = std::max<int64_t>(0, std::floor(last[0]));
  const int64_t cy = std::max<int64_t>(0, std::floor(last[1]));
  const uint8_t* got = &after.rgb[(cy * w + cx) * 3];
  const uint8_t* want = palette[labels[n - 1] % 10];
  EXPECT_EQ(std::vector<int>(got, got + 3), std::vector<int>(want, want + 3));
  remove_tree(dir);
}

TEST_F(ServerGrpc, FakeDetectorOutputsAndParameters) {
  rpc::Client c(*address_);
  const auto jpg = read_file(kFixtures + "/images/coffee.jpg");  // 600 x 400
  auto r =
      c.infer(images_request("fake", 1,
                             "outputs { name: \"boxes\" } outputs { name: \"label_names\" } "
                             "outputs { name: \"num_detections\" } outputs { name: \"logits\" }"),
              {rpc::pack_bytes({jpg})});
  ASSERT_TRUE(r.ok()) << r.message;
  ASSERT_EQ(r.outputs.size(), 4u);
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{4});
  // Highest score first; ties (all 0.8808) keep torch.topk's order, so compare as a set.
  const auto boxes = values<float>(r.output("boxes").data);
  ASSERT_EQ(boxes.size(), 16u);
  std::set<int> x0;
  for (int j = 0; j < 4; ++j) {
    x0.insert(static_cast<int>(std::lround(boxes[j * 4])));
    EXPECT_NEAR(boxes[j * 4 + 1], (0.5 - 0.1) * 400, 1e-3);
    EXPECT_NEAR(boxes[j * 4 + 3] - boxes[j * 4 + 1], 0.2 * 400, 1e-3);
  }
  EXPECT_EQ(x0, (std::set<int>{90, 210, 330, 450}));  // (0.2q + 0.2 - 0.05) * 600
  EXPECT_EQ(r.output("label_names").data.size(), 4u * 4u + 3u + 3u + 4u + 3u);  // cat dog bird cat
  EXPECT_EQ(r.output("logits").shape, (std::vector<int64_t>{1, 4, 3}));
  // threshold 0.9 keeps nothing; top_k 2 keeps two.
  r = c.infer(
      images_request("fake", 1, "parameters { key: \"threshold\" value { double_param: 0.9 } }"),
      {rpc::pack_bytes({jpg})});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{0});
  EXPECT_EQ(r.output("scores").shape, (std::vector<int64_t>{1, 0}));
  r = c.infer(images_request("fake", 1, "parameters { key: \"top_k\" value { int64_param: 2 } }"),
              {rpc::pack_bytes({jpg})});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{2});
}

struct BadCase {
  const char* what;
  std::string text;
  std::vector<std::string> raw;
  Code code;
  std::string message;  ///< expected substring
};

TEST_F(ServerGrpc, BadInputsGetExactStatuses) {
  rpc::Client c(*address_, 64 << 20);
  const auto jpg = read_file(kFixtures + "/images/coffee.jpg");
  std::string corrupt = jpg.substr(0, 600) + std::string(400, '\x5a');
  // The JPEG with its frame header (SOF0/SOF2) claiming 10000 x 10000 pixels: rejected from the
  // header, before decoding.
  std::string huge = jpg;
  for (std::size_t i = 0; i + 9 < huge.size(); ++i) {
    if (huge[i] == '\xff' && (huge[i + 1] == '\xc0' || huge[i + 1] == '\xc2')) {
      huge[i + 5] = '\x27';
      huge[i + 6] = '\x10';
      huge[i + 7] = '\x27';
      huge[i + 8] = '\x10';
      break;
    }
  }
  const std::vector<std::string> many(65, "x");
  const std::string pv8 =
      "inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, 8] }";
  const std::vector<BadCase> cases = {
      {"unknown model",
       images_request("nope", 1),
       {rpc::pack_bytes({jpg})},
       Code::not_found,
       "unknown model 'nope'"},
      {"unknown version",
       images_request("fake", 1, "model_version: \"3\""),
       {rpc::pack_bytes({jpg})},
       Code::not_found,
       "model 'fake' has no version '3'"},
      {"wrong datatype",
       "model_name: \"fake\" inputs { name: \"images\" datatype: \"FP32\" shape: 1 }",
       {std::string(4, '\0')},
       Code::invalid_argument,
       "input 'images': datatype FP32, expected BYTES"},
      {"wrong shape",
       "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 4, 8, "
       "8] }",
       {std::string(4 * 64 * 4, '\0')},
       Code::invalid_argument,
       "input 'pixel_values': shape [1,4,8,8], expected [N,3,H,W]"},
      {"shape/byte-size mismatch",
       "model_name: \"fake\" " + pv8,
       {std::string(10, '\0')},
       Code::invalid_argument,
       "input 'pixel_values': shape [1,3,8,8] needs 768 bytes of FP32, got 10"},
      {"BYTES count mismatch",
       images_request("fake_batching", 2),
       {rpc::pack_bytes({jpg})},
       Code::invalid_argument,
       "input 'images': shape [2] says 2 elements but the BYTES data holds 1"},
      {"malformed BYTES",
       images_request("fake", 1),
       {std::string("\xff\x00\x00\x00"
                    "abc",
                    7)},  // length 255, 3 bytes
       Code::invalid_argument,
       "input 'images': BYTES data is malformed"},
      {"raw and typed both",
       "model_name: \"fake\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 contents { "
       "bytes_contents: \"x\" } }",
       {rpc::pack_bytes({jpg})},
       Code::invalid_argument,
       "input 'images': both contents and raw_input_contents are set"},
      {"raw count",
       images_request("fake", 1) +
           " inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] }",
       {rpc::pack_bytes({jpg})},
       Code::invalid_argument,
       "raw_input_contents has 1 entries for 2 inputs"},
      {"typed in the wrong field",
       "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 1, "
       "1] contents { int64_contents: [1, 2, 3] } }",
       {},
       Code::invalid_argument,
       "input 'pixel_values': datatype FP32 expects typed contents in fp32_contents"},
      {"empty batch",
       images_request("fake", 0),
       {std::string()},
       Code::invalid_argument,
       "input 'images': empty batch (N = 0)"},
      {"0-byte image",
       images_request("fake", 1),
       {rpc::pack_bytes({""})},
       Code::invalid_argument,
       "input 'images': image 0 is empty (0 bytes)"},
      {"corrupt JPEG",
       images_request("fake", 1),
       {rpc::pack_bytes({corrupt})},
       Code::invalid_argument,
       "input 'images': image 0: "},
      {"not an image",
       images_request("fake", 1),
       {rpc::pack_bytes({"hello world"})},
       Code::invalid_argument,
       "input 'images': image 0: "},
      {"above max_batch_size",
       images_request("fake", 2),
       {rpc::pack_bytes({jpg, jpg})},
       Code::invalid_argument,
       "input 'images': batch of 2 exceeds the model's max_batch_size 1"},
      {"unknown input",
       "model_name: \"fake\" inputs { name: \"pixels\" datatype: \"FP32\" shape: 1 }",
       {std::string(4, '\0')},
       Code::invalid_argument,
       "unexpected input 'pixels'"},
      {"no input", "model_name: \"fake\"", {}, Code::invalid_argument, "missing input"},
      {"unknown output",
       images_request("fake", 1, "outputs { name: \"masks\" }"),
       {rpc::pack_bytes({jpg})},
       Code::invalid_argument,
       "unknown output 'masks'"},
      {"bad threshold",
       images_request("fake", 1,
                      "parameters { key: \"threshold\" value { string_param: \"high\" } }"),
       {rpc::pack_bytes({jpg})},
       Code::invalid_argument,
       "parameter 'threshold' must be a number"},
      {"pixels above the limit",
       images_request("fake", 1),
       {rpc::pack_bytes({huge})},
       Code::invalid_argument,
       "input 'images': image 0: "},
      {"images above the limit",
       images_request("fake_batching", 65),
       {rpc::pack_bytes(many)},
       Code::invalid_argument,
       "input 'images': 65 images exceed the limit of 64 per request"},
      {"message too large",
       images_request("fake", 1),
       {rpc::pack_bytes({std::string(17 << 20, 'x')})},
       Code::resource_exhausted,
       "larger than max"},
  };
  for (const auto& bc : cases) {
    auto r = c.infer(bc.text, bc.raw);
    EXPECT_EQ(r.code, bc.code) << bc.what << ": " << api::code_name(r.code) << " " << r.message;
    std::cout << bc.what << ": " << api::code_name(r.code) << " " << r.message.substr(0, 160)
              << "\n";
    EXPECT_NE(r.message.find(bc.message), std::string::npos)
        << bc.what << ": message '" << r.message << "' lacks '" << bc.message << "'";
  }
  EXPECT_TRUE(FakeState::get().batches().empty()) << "a bad request reached the model";
  // Still serving after all of that.
  EXPECT_TRUE(c.infer(images_request("fake", 1), {rpc::pack_bytes({jpg})}).ok());
}

/// Bytes that are not a protobuf of the method's request type (gRPC's generated handlers
/// answered UNIMPLEMENTED with no message): INVALID_ARGUMENT naming the method, the message type
/// and the size, for every unary RPC; one warning line for the burst (at most one per second).
TEST_F(ServerGrpc, MalformedRequestBytesAreInvalidArgument) {
  rpc::Client c(*address_);
  log::Capture capture;
  // A field number 0 tag: invalid in every message.
  const std::string garbage("\x07\xff\xff\xff", 4);
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"ServerLive", "ServerLiveRequest"},
      {"ServerReady", "ServerReadyRequest"},
      {"ModelReady", "ModelReadyRequest"},
      {"ServerMetadata", "ServerMetadataRequest"},
      {"ModelMetadata", "ModelMetadataRequest"},
      {"ModelInfer", "ModelInferRequest"},
      {"ModelConfig", "ModelConfigRequest"},
      {"ModelStatistics", "ModelStatisticsRequest"},
      {"RepositoryIndex", "RepositoryIndexRequest"},
      {"RepositoryModelLoad", "RepositoryModelLoadRequest"},
      {"RepositoryModelUnload", "RepositoryModelUnloadRequest"},
      {"SystemSharedMemoryStatus", "SystemSharedMemoryStatusRequest"},
      {"SystemSharedMemoryRegister", "SystemSharedMemoryRegisterRequest"},
      {"SystemSharedMemoryUnregister", "SystemSharedMemoryUnregisterRequest"},
      {"CudaSharedMemoryStatus", "CudaSharedMemoryStatusRequest"},
      {"CudaSharedMemoryRegister", "CudaSharedMemoryRegisterRequest"},
      {"CudaSharedMemoryUnregister", "CudaSharedMemoryUnregisterRequest"}};
  for (const auto& [method, type] : methods) {
    const auto r = c.call_raw(method, garbage);
    EXPECT_EQ(r.code, Code::invalid_argument) << method << ": " << api::code_name(r.code);
    EXPECT_EQ(r.message, method + ": the request is not a valid inference." + type +
                             " (protobuf parse failed, 4 bytes)");
  }
  // A ModelInferRequest cut short: model_name (field 1) says 10 bytes, 3 follow.
  const auto truncated = c.call_raw("ModelInfer", std::string("\x0a\x0ahel", 5));
  EXPECT_EQ(truncated.code, Code::invalid_argument) << api::code_name(truncated.code);
  EXPECT_EQ(truncated.message,
            "ModelInfer: the request is not a valid inference.ModelInferRequest (protobuf parse "
            "failed, 5 bytes)");
  // The same bytes, whole, are a request: the raw path parses what the typed one did.
  const auto whole = c.call_raw("ModelReady", std::string("\x0a\x04"
                                                          "fake",
                                                          6));
  EXPECT_TRUE(whole.ok()) << api::code_name(whole.code) << " " << whole.message;
  EXPECT_EQ(whole.text, std::string("\x08\x01", 2));  // ready: true
  // Above server.max_message_bytes (16 MiB here) gRPC refuses the bytes before any parsing.
  const auto big = c.call_raw("ModelInfer", std::string((16 << 20) + 1, 'x'));
  EXPECT_EQ(big.code, Code::resource_exhausted) << api::code_name(big.code);
  EXPECT_EQ(big.message, "Received message larger than max (16777217 vs. 16777216)");
  // 18 failures within a second or two: the first is logged, the rest counted (a second line,
  // if the burst crossed a one-second boundary, says how many it left out).
  const int logged = capture.count(log::Level::warn, "the request is not a valid inference.");
  EXPECT_GE(logged, 1);
  EXPECT_LE(logged, 3);
  // Still serving.
  EXPECT_TRUE(c.call("ServerLive").ok());
}

TEST_F(ServerGrpc, QueueOverflowIsResourceExhausted) {
  rpc::Client c(*address_);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  FakeState::get().sleep_ms = 600;
  // max_batch_size 1, max_queue_size 2: one runs, two wait, the rest overflow.
  std::vector<std::future<rpc::InferResult>> calls;
  for (int i = 0; i < 6; ++i) {
    calls.push_back(
        std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  int ok = 0, exhausted = 0;
  for (auto& f : calls) {
    auto r = f.get();
    if (r.ok()) ++ok;
    if (r.code == Code::resource_exhausted) {
      ++exhausted;
      EXPECT_EQ(r.message, "model 'fake': queue full (max_queue_size 2 requests waiting)");
    }
  }
  std::cout << "ok " << ok << ", RESOURCE_EXHAUSTED " << exhausted << "\n";
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(exhausted, 3);
}

TEST_F(ServerGrpc, DeadlineExpiredInQueueNeverRuns) {
  rpc::Client c(*address_);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  HeldForwards held;  // the first request's forward lasts until released, whatever the load
  auto first =
      std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); });
  ASSERT_TRUE(FakeState::get().wait_entered(1));
  // One instance, max_batch_size 1, busy: the second request waits in the queue past its
  // deadline. The server counts the client's reset in the window's last half as the deadline
  // (transit under CI load reached 100 ms, grpc_server.cpp InferCall::OnCancel).
  auto late = c.infer(images_request("fake", 1), {jpg}, 0.6);
  EXPECT_EQ(late.code, Code::deadline_exceeded) << late.message;
  // The client gives up at its deadline; the server learns it from the stream's reset a moment
  // later (or from its own deadline, computed from grpc-timeout on arrival: later still).
  // Releasing the forward before then would let the worker take the request while it still
  // looks alive, so wait for the server's answer first.
  const std::string expired_line =
      "libreyolo_inference_requests_total{code=\"DEADLINE_EXCEEDED\",model=\"fake\","
      "version=\"1\"} 1";
  for (int i = 0; i < 500 && daemon_->metrics().serialize().find(expired_line) == std::string::npos;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  held.release();
  EXPECT_TRUE(first.get().ok());
  // The worker takes requests in order: once a third one has run, the expired one has left
  // the queue without running or will never run.
  EXPECT_TRUE(c.infer(images_request("fake", 1), {jpg}).ok());
  EXPECT_EQ(FakeState::get().batches(), (std::vector<int64_t>{1, 1})) << "the expired request ran";
  const auto metrics = daemon_->metrics().serialize();
  EXPECT_NE(metrics.find(expired_line), std::string::npos) << metrics;
}

/// A CPU model's batch is answered as soon as its forward returns, not after the next batch's
/// forward: the one-batch-in-flight overlap is for CUDA, whose forwards are asynchronous. With
/// the overlap on the CPU, a request queued behind a batch held that batch's answers for its own
/// whole forward (here: until the test lets the second forward end).
TEST_F(ServerGrpc, CpuAnswersDoNotWaitForTheNextForward) {
  rpc::Client c(*address_);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  std::promise<void> gate;
  std::shared_future<void> second_may_end = gate.get_future().share();
  std::atomic<int> forwards{0};
  FakeState::get().in_forward = [&forwards, second_may_end] {
    if (++forwards == 2) second_may_end.wait();
  };
  HeldForwards held;
  auto first =
      std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); });
  ASSERT_TRUE(FakeState::get().wait_entered(1));
  auto second =
      std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); });
  // max_batch_size 1: the second request waits in the queue while the first forward runs.
  const std::string queued = "libreyolo_pending_requests{model=\"fake\"} 1";
  for (int i = 0; i < 1000 && daemon_->metrics().serialize().find(queued) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_NE(daemon_->metrics().serialize().find(queued), std::string::npos);
  held.release();  // the first forward ends; the second one starts and waits for the gate
  const bool answered = first.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  gate.set_value();
  EXPECT_TRUE(answered) << "the first request's answer waited for the second forward";
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  FakeState::get().in_forward = nullptr;
}

TEST_F(ServerGrpc, DynamicBatchingGroupsConcurrentRequests) {
  rpc::Client c(*address_);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  std::vector<std::future<rpc::InferResult>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async,
                               [&] { return c.infer(images_request("fake_batching", 1), {jpg}); }));
  }
  for (auto& f : calls) EXPECT_TRUE(f.get().ok());
  const auto batches = FakeState::get().batches();
  std::cout << "batches:";
  for (auto b : batches) std::cout << " " << b;
  std::cout << "\n";
  EXPECT_EQ(batches, std::vector<int64_t>{4});  // 1 s window: all four in one forward
}

TEST_F(ServerGrpc, HttpAdminEndpoints) {
  const int port = daemon_->http_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(http_get(port, "/v2/health/live").status, 200);
  auto ready = http_get(port, "/v2/health/ready");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "{\"ready\":true}");
  rpc::Client c(*address_);
  ASSERT_TRUE(c.infer(images_request("fake", 1),
                      {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})})
                  .ok());
  auto m = http_get(port, "/metrics");
  EXPECT_EQ(m.status, 200);
  for (const char* name :
       {"libreyolo_request_duration_seconds_bucket{model=\"fake\",version=\"1\",le=\"0.0005\"}",
        "libreyolo_queue_duration_seconds_count{model=\"fake\",version=\"1\"}",
        "libreyolo_compute_duration_seconds_sum{model=\"fake\",version=\"1\"}",
        "libreyolo_preprocess_duration_seconds_count{model=\"fake\",version=\"1\"}",
        "libreyolo_batch_size_bucket{model=\"fake\",le=\"1\"}",
        "libreyolo_pending_requests{model=\"fake\"} 0",
        "libreyolo_model_load_seconds{model=\"rtdetr_tiny\",version=\"1\"}",
        "libreyolo_inference_requests_total{code=\"OK\",model=\"fake\",version=\"1\"}",
        "# TYPE libreyolo_kernel_calls_total counter"}) {
    EXPECT_NE(m.body.find(name), std::string::npos) << "missing " << name << " in\n" << m.body;
  }
  // The selected fake_quant_fp8 implementation is machine-dependent (reference here, cuda on a
  // GPU machine); the gauge must name whichever the registry selected.
  const std::string active_line =
      "libreyolo_kernel_active{slot=\"fake_quant_fp8\",impl=\"" +
      libreyolo::kernels::Registry::process_default().active().at("fake_quant_fp8") + "\"} 1";
  EXPECT_NE(m.body.find(active_line), std::string::npos) << "missing " << active_line;
  auto active = http_get(port, "/active");
  EXPECT_EQ(active.status, 200);
  EXPECT_NE(active.body.find("\"fake_quant_fp8\": {"), std::string::npos) << active.body;
  EXPECT_NE(active.body.find("\"state\": \"READY\""), std::string::npos) << active.body;
  // The kernel part has the schema of libreyolo-kernels --json (kernels/report_json.h), with
  // what the loaded model was bound to: on a CPU model the attention slot's first candidate is
  // sdpa (mem_efficient binds to CUDA models only), and nothing serves ms_deform_attn.
  const auto doc = nlohmann::json::parse(active.body);
  for (const char* key : {"policy", "active", "slots", "bindings", "providers", "fallback_events",
                          "built_with_cuda", "hub_builds"})
    EXPECT_TRUE(doc.contains(key)) << key;
  // Hub builds loaded by this process (kernels/hub/provider.h loaded_builds).
  EXPECT_TRUE(doc["hub_builds"].is_array()) << doc["hub_builds"];
  if (doc["models"].size() > 0 && doc["bindings"].contains("rtdetr_tiny")) {
    const auto& b = doc["bindings"]["rtdetr_tiny"];
    EXPECT_EQ(b["attention"]["selected"], "sdpa");
    // By name: a build with the CUDA kernels on a GPU machine lists `cuda` too.
    std::string mem_efficient_reason;
    for (const auto& c : b["attention"]["candidates"])
      if (c["name"] == "mem_efficient") mem_efficient_reason = c["reason"];
    EXPECT_EQ(mem_efficient_reason, "the model is not on a CUDA device");
    EXPECT_EQ(b["ms_deform_attn"]["selected"], "cpu");  // kernels/attention/cpu/
    EXPECT_NE(m.body.find("libreyolo_model_kernel_active{model=\"rtdetr_tiny\",slot=\"attention\","
                          "impl=\"sdpa\"} 1"),
              std::string::npos)
        << m.body;
  } else {
    ADD_FAILURE() << "rtdetr_tiny has no kernel bindings in /active: " << active.body;
  }
  EXPECT_EQ(http_get(port, "/nothing").status, 404);
}

TEST(ServerLifecycle, FailingModelKeepsOthersServingAndReadinessFalse) {
  const auto repo = temp_dir("broken");
  add_fake_model(repo, "fake", "");
  write_file(repo / "broken" / "1" / "config.json", "{not json");
  write_file(repo / "noversion" / "README", "x");
  Daemon d(test_config(repo), fake_or_real());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  EXPECT_EQ(c.call("ServerReady").text, "");  // ready: false
  EXPECT_EQ(c.health("readiness").text, "NOT_SERVING");
  EXPECT_EQ(c.health("liveness").text, "SERVING");
  auto idx = c.call("RepositoryIndex");
  EXPECT_NE(
      idx.text.find("name: \"broken\"\n  version: \"1\"\n  state: \"UNAVAILABLE\"\n  reason: \""),
      std::string::npos)
      << idx.text;
  EXPECT_NE(idx.text.find("config.json: invalid JSON"), std::string::npos) << idx.text;
  EXPECT_NE(idx.text.find("no numeric version folder"), std::string::npos) << idx.text;
  auto r = c.infer(images_request("broken", 1), {rpc::pack_bytes({"x"})});
  EXPECT_EQ(r.code, Code::unavailable);
  EXPECT_NE(r.message.find("model 'broken' is not ready (UNAVAILABLE: "), std::string::npos)
      << r.message;
  EXPECT_TRUE(c.infer(images_request("fake", 1),
                      {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})})
                  .ok());
  EXPECT_EQ(http_get(d.http_port(), "/v2/health/ready").status, 503);
  d.stop(1.0);
  remove_tree(repo);
}

TEST(ServerLifecycle, DrainFlipsReadinessButKeepsServing) {
  const auto repo = temp_dir("drain");
  add_fake_model(repo, "fake", "");
  Daemon d(test_config(repo), fake_or_real());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  EXPECT_EQ(c.health("readiness").text, "SERVING");
  d.begin_drain();
  EXPECT_EQ(c.health("readiness").text, "NOT_SERVING");
  EXPECT_EQ(c.health("").text, "NOT_SERVING");
  EXPECT_EQ(c.health("liveness").text, "SERVING");
  EXPECT_EQ(c.call("ServerReady").text, "");
  EXPECT_EQ(http_get(d.http_port(), "/v2/health/ready").status, 503);
  EXPECT_EQ(http_get(d.http_port(), "/v2/health/live").status, 200);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  EXPECT_TRUE(c.infer(images_request("fake", 1), {jpg}).ok());
  // In-flight requests finish after stop() begins; new calls are refused.
  FakeState::get().reset();
  FakeState::get().sleep_ms = 300;
  auto inflight =
      std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  d.stop(5.0);
  auto r = inflight.get();
  EXPECT_TRUE(r.ok()) << api::code_name(r.code) << " " << r.message;
  EXPECT_EQ(c.call("ServerLive", "", 1.0).code, Code::unavailable);
  FakeState::get().reset();
  remove_tree(repo);
}

/// LogLimiter (server/grpc/log_limiter.h) on a clock the test moves: one line per second, the
/// next one counting what was left out.
TEST(GrpcLogLimiter, OneLinePerIntervalThenTheCount) {
  log::Capture capture;
  rpc::LogLimiter limiter(log::Level::warn, std::chrono::seconds(1));
  const auto t0 = rpc::LogLimiter::Clock::time_point{} + std::chrono::hours(1);
  EXPECT_TRUE(limiter.write("bad request", t0));
  EXPECT_FALSE(limiter.write("bad request", t0 + std::chrono::milliseconds(1)));
  EXPECT_FALSE(limiter.write("bad request", t0 + std::chrono::milliseconds(999)));
  EXPECT_TRUE(limiter.write("bad request again", t0 + std::chrono::milliseconds(1000)));
  EXPECT_TRUE(limiter.write("quiet since", t0 + std::chrono::seconds(5)));
  std::vector<std::string> lines;
  for (const auto& l : capture.lines()) {
    if (l.level == log::Level::warn) lines.push_back(l.text);
  }
  EXPECT_EQ(lines,
            (std::vector<std::string>{
                "bad request", "bad request again (2 more since the last line)", "quiet since"}));
}

/// The stop (Daemon::stop after the drain window): while the calls in flight finish, every new
/// call, on an open connection or a new one, is answered UNAVAILABLE "the server is shutting
/// down" by the service itself; gRPC's own Shutdown comes after them (it answered new calls on
/// an open connection CANCELLED), and from then on the port refuses connections (UNAVAILABLE).
TEST(ServerLifecycle, CallsDuringTheStopAreUnavailable) {
  const auto repo = temp_dir("stop-refusal");
  add_fake_model(repo, "fake", "");
  Daemon d(test_config(repo), fake_or_real());
  d.start();
  const std::string address = "127.0.0.1:" + std::to_string(d.grpc_port());
  rpc::Client c(address);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  FakeState::get().reset();
  HeldForwards held;
  auto inflight =
      std::async(std::launch::async, [&] { return c.infer(images_request("fake", 1), {jpg}); });
  ASSERT_TRUE(FakeState::get().wait_entered(1));

  std::promise<void> refusing;
  auto refusing_seen = refusing.get_future();
  std::once_flag once;
  const int sink = log::add_sink([&](log::Level, std::string_view line) {
    if (line.find("gRPC: refusing new calls") != std::string_view::npos)
      std::call_once(once, [&] { refusing.set_value(); });
  });
  auto stopping = std::async(std::launch::async, [&] { d.stop(30.0); });
  ASSERT_EQ(refusing_seen.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  log::remove_sink(sink);

  // The forward is still held: the stop waits for it, refusing the rest.
  const auto live = c.call("ServerLive", "", 5.0);
  EXPECT_EQ(live.code, Code::unavailable) << api::code_name(live.code);
  EXPECT_EQ(live.message, "the server is shutting down");
  const auto infer = c.infer(images_request("fake", 1), {jpg}, 5.0);
  EXPECT_EQ(infer.code, Code::unavailable) << api::code_name(infer.code);
  EXPECT_EQ(infer.message, "the server is shutting down");
  const auto garbage = c.call_raw("ModelInfer", std::string("\x07\xff", 2), 5.0);
  EXPECT_EQ(garbage.code, Code::unavailable) << api::code_name(garbage.code);
  EXPECT_EQ(garbage.message, "the server is shutting down");
  rpc::Client fresh(address);  // a new connection: still accepted, and refused the same way
  const auto metadata = fresh.call("ServerMetadata", "", 5.0);
  EXPECT_EQ(metadata.code, Code::unavailable) << api::code_name(metadata.code);
  EXPECT_EQ(metadata.message, "the server is shutting down");
  EXPECT_EQ(fresh.health("liveness", 5.0).text, "SERVING");  // alive until gRPC shuts down

  held.release();
  const auto r = inflight.get();
  EXPECT_TRUE(r.ok()) << api::code_name(r.code) << " " << r.message;
  stopping.get();
  const auto after = c.call("ServerLive", "", 1.0);
  EXPECT_EQ(after.code, Code::unavailable) << api::code_name(after.code);
  EXPECT_EQ(after.message, "failed to connect to all addresses; last error: UNKNOWN: ipv4:" +
                               address + ": Failed to connect to remote host: Connection refused");
  FakeState::get().reset();
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
