// Image classifiers served by the daemon (in process, loopback, a real gRPC client): the vit_tiny,
// swin_tiny and deit_tiny fixtures against the transformers reference logits, probabilities, top-k
// label names, ModelMetadata/ModelConfig, the per-model `fused_attention` key of serving.yaml (and
// the server's kernels.fused_attention), and a bad serving.yaml value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <future>

#include <c10/util/StringUtil.h>

#include "log/log.h"
#include "models/core/safetensors.h"
#include "models/registry/family.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/config/serving_config.h"
#include "server/grpc/client.h"
#include "server/instance/loaded_model.h"
#include "server_test_support.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

/// The registered Family::fused_attention_default of `model_type`.
bool fused_default(const std::string& model_type) {
  return models::FamilyRegistry::builtin().find(model_type)->fused_attention_default;
}

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

/// Attention modules of the fixtures: ViT 2 layers, Swin depths [1,2,1].
constexpr int kVitAttention = 2, kSwinAttention = 4;

/// Modules set_fused_attention(`enabled`) changes on a freshly loaded model of a family whose
/// measured default is `family_default`.
std::string changed(bool enabled, bool family_default, int modules) {
  return std::to_string(enabled == family_default ? 0 : modules);
}

/// The device the models run on: cpu, or LIBREYOLO_TEST_DEVICE (e.g. cuda on the GPU machine:
/// the same tests, the same 1e-4 bounds). For CUDA, TF32 is switched off first: cuDNN
/// convolutions (the patch embeddings) default to TF32 on Ampere and later, ~1e-3 off float32.
std::string test_device() {
  static const std::string device = [] {
    const char* d = std::getenv("LIBREYOLO_TEST_DEVICE");
    const std::string name = d && *d ? d : "cpu";
    if (name != "cpu") {
      at::globalContext().setAllowTF32CuDNN(false);
      at::globalContext().setAllowTF32CuBLAS(false);
    }
    return name;
  }();
  return device;
}

ServerConfig test_config(const fs::path& repo, const std::string& yaml = "") {
  return loopback_config(repo, test_device(), yaml);
}

/// The fixture's model input, exactly as transformers computed it (tests/fixtures/README.md:
/// (float32(u8) - mean*255) / (std*255), mean = std = 0.5 for both classifiers).
at::Tensor fixture_pixels(const std::string& fixture) {
  // The processor's normalisation with the fixture's mean/std (0.5 for ViT/Swin, ImageNet's for
  // DeiT), bit-exact with transformers.
  return libreyolo::test::normalized_pixels(kFixtures + "/models/" + fixture).contiguous();
}

at::Tensor expected(const std::string& fixture, const std::string& key) {
  const auto file = models::core::SafetensorsFile::open(kFixtures + "/models/" + fixture +
                                                        "/expected.safetensors");
  return file->view(key).clone();
}

std::string raw_of(const at::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * 4);
}

at::Tensor tensor_of(const api::OutputTensor& o) {
  EXPECT_EQ(o.datatype, "FP32") << o.name;
  auto v = values<float>(o.data);
  return at::tensor(v).view(o.shape).clone();
}

std::vector<std::string> unpack(const std::string& raw) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at + 4 <= raw.size()) {
    std::uint32_t n = 0;
    std::memcpy(&n, raw.data() + at, 4);
    out.push_back(raw.substr(at + 4, n));
    at += 4 + n;
  }
  return out;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

std::string pixels_request(const std::string& model, const at::Tensor& pv,
                           const std::string& extra = "") {
  return c10::str("model_name: \"", model,
                  "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [", pv.size(0),
                  ", 3, ", pv.size(2), ", ", pv.size(3), "] } ", extra);
}

/// "key: \"<key>\"\n    value {\n      string_value: \"<value>\"" as ModelConfig prints it.
bool has_parameter(const std::string& text, const std::string& key, const std::string& value) {
  const auto at = text.find("key: \"" + key + "\"");
  if (at == std::string::npos) return false;
  const auto v = text.find("string_value: \"", at);
  return v != std::string::npos && text.compare(v + 15, value.size() + 1, value + "\"") == 0;
}

class ServerClassifier : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("classifier-repo"));
    add_fixture_model(*repo_, "vit_tiny", "vit_tiny", "max_batch_size: 4\n");
    add_fixture_model(*repo_, "swin_tiny", "swin_tiny", "warmup: false\n");
    add_fixture_model(*repo_, "deit_tiny", "deit_tiny", "max_batch_size: 4\n");  // warm-up: 224
    add_fixture_model(*repo_, "vit_fused_on", "vit_tiny", "warmup: false\nfused_attention: on\n");
    add_fixture_model(*repo_, "vit_fused_off", "vit_tiny", "warmup: false\nfused_attention: off\n");
    add_fixture_model(*repo_, "swin_fused_on", "swin_tiny", "warmup: false\nfused_attention: on\n");
    add_fixture_model(*repo_, "vit_bad", "vit_tiny", "warmup: false\nfused_attention: maybe\n");
    add_fixture_model(*repo_, "vit_batching", "vit_tiny",
                      "warmup: false\nmax_batch_size: 4\nmax_queue_delay_microseconds: 3000000\n");
    capture_ = new log::Capture;
    daemon_ = new Daemon(test_config(*repo_));
    daemon_->start();
    address_ = new std::string("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete capture_;
    remove_tree(*repo_);
    delete repo_;
    delete address_;
  }

  /// Sends the fixture's exact pixels and checks logits against both transformers references
  /// (SDPA `logits`, eager `logits_eager`) within 1e-4, probabilities = softmax and sum 1,
  /// and the top-k outputs. Returns the logits.
  static at::Tensor check_fixture(const std::string& model, const std::string& fixture) {
    rpc::Client c(*address_);
    const auto pv = fixture_pixels(fixture);
    auto r = c.infer(pixels_request(model, pv), {raw_of(pv)});
    EXPECT_TRUE(r.ok()) << model << ": " << r.message;
    if (!r.ok()) return {};
    EXPECT_EQ(r.model_name, model);
    EXPECT_EQ(r.model_version, "1");
    EXPECT_EQ(r.outputs.size(), 5u);
    const auto logits = tensor_of(r.output("logits"));
    const auto probs = tensor_of(r.output("probabilities"));
    const auto ref = expected(fixture, "logits");
    const auto ref_eager = expected(fixture, "logits_eager");
    EXPECT_EQ(logits.sizes(), ref.sizes()) << model;
    EXPECT_EQ(probs.sizes(), ref.sizes()) << model;
    const double d = max_abs_diff(logits, ref), d_eager = max_abs_diff(logits, ref_eager);
    const double d_prob = max_abs_diff(probs, at::softmax(ref, -1));
    const double d_sum = (probs.sum(-1) - 1.0).abs().max().item<double>();
    std::cout << "[" << model << "] max|logits - transformers logits| = " << d
              << ", eager: " << d_eager << ", max|probabilities - softmax(ref)| = " << d_prob
              << ", max|sum(probabilities) - 1| = " << d_sum << "\n";
    EXPECT_LE(d, 1e-4) << model;
    EXPECT_LE(d_eager, 1e-4) << model;
    EXPECT_LE(d_prob, 1e-5) << model;
    EXPECT_LE(d_sum, 1e-5) << model;
    // Default K = 5 = C here: the full ranking, descending, named by id2label.
    const auto& scores_t = r.output("scores");
    EXPECT_EQ(scores_t.shape, (std::vector<int64_t>{2, 5})) << model;
    const auto scores = values<float>(scores_t.data);
    const auto labels = values<int64_t>(r.output("labels").data);
    const auto names = unpack(r.output("label_names").data);
    EXPECT_EQ(r.output("label_names").shape, (std::vector<int64_t>{2, 5}));
    EXPECT_EQ(names.size(), 10u);
    for (int64_t i = 0; i < 2 && labels.size() == 10 && names.size() == 10; ++i) {
      const auto order = std::get<1>(at::sort(ref[i], -1, /*descending=*/true));
      for (int64_t j = 0; j < 5; ++j) {
        EXPECT_EQ(labels[i * 5 + j], order[j].item<int64_t>()) << model << " " << i << "," << j;
        EXPECT_EQ(names[i * 5 + j], "LABEL_" + std::to_string(labels[i * 5 + j]));
        EXPECT_NEAR(scores[i * 5 + j], probs[i][labels[i * 5 + j]].item<float>(), 1e-7);
      }
    }
    return logits;
  }

  static fs::path* repo_;
  static Daemon* daemon_;
  static std::string* address_;
  static log::Capture* capture_;
};
fs::path* ServerClassifier::repo_ = nullptr;
Daemon* ServerClassifier::daemon_ = nullptr;
std::string* ServerClassifier::address_ = nullptr;
log::Capture* ServerClassifier::capture_ = nullptr;

TEST_F(ServerClassifier, VitSwinAndDeitMatchTransformers) {
  check_fixture("vit_tiny", "vit_tiny");
  check_fixture("swin_tiny", "swin_tiny");
  check_fixture("deit_tiny", "deit_tiny");
}

TEST_F(ServerClassifier, FusedAttentionOnOffKeepsOutputs) {
  // `on`/`off` flip every attention module whose family default (the registered
  // Family::fused_attention_default, decided by measurement) differs; `default` calls nothing.
  const auto vit = check_fixture("vit_tiny", "vit_tiny");
  const auto on = check_fixture("vit_fused_on", "vit_tiny");
  const auto off = check_fixture("vit_fused_off", "vit_tiny");
  const auto swin = check_fixture("swin_tiny", "swin_tiny");
  const auto swin_fused = check_fixture("swin_fused_on", "swin_tiny");
  ASSERT_TRUE(vit.defined() && on.defined() && off.defined() && swin.defined() &&
              swin_fused.defined());
  const double d_on = max_abs_diff(on, vit), d_off = max_abs_diff(off, vit);
  const double d_swin = max_abs_diff(swin_fused, swin);
  std::cout << "vit: max|on - default| = " << d_on << ", max|off - default| = " << d_off
            << "; swin: max|on - default| = " << d_swin << "\n";
  EXPECT_LE(d_on, 1e-4);
  EXPECT_LE(d_off, 1e-4);
  EXPECT_LE(d_swin, 1e-4);

  rpc::Client c(*address_);
  struct Case {
    std::string model, value, changed, source_prefix;
  };
  const bool vit_default = fused_default("vit");
  const bool swin_default = fused_default("swin");
  const std::string vit_on = changed(true, vit_default, kVitAttention);
  const std::string vit_off = changed(false, vit_default, kVitAttention);
  const std::string swin_on = changed(true, swin_default, kSwinAttention);
  for (const auto& k : std::vector<Case>{{"vit_tiny", "default", "0", "family default"},
                                         {"vit_fused_on", "on", vit_on, "serving.yaml "},
                                         {"vit_fused_off", "off", vit_off, "serving.yaml "},
                                         {"swin_fused_on", "on", swin_on, "serving.yaml "}}) {
    auto r = c.call("ModelConfig", "name: \"" + k.model + "\"");
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention", k.value)) << k.model << "\n" << r.text;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention_modules_changed", k.changed))
        << k.model << "\n"
        << r.text;
    EXPECT_TRUE(has_parameter(
        r.text, "fused_attention_source",
        k.source_prefix +
            (k.value == "default" ? "" : repo_->string() + "/" + k.model + "/serving.yaml:2:18")))
        << k.model << "\n"
        << r.text;
  }
  // The load logged the counts; `default` changes nothing and logs nothing.
  auto logged = [&](const std::string& model, const std::string& value, const std::string& n) {
    const std::string line = "model '" + model + "': fused_attention " + value + " (serving.yaml " +
                             repo_->string() + "/" + model + "/serving.yaml:2:18): " + n +
                             " attention modules changed to " +
                             (value == "on" ? "SDPA" : "the manual path");
    return capture_->count(log::Level::info, line);
  };
  EXPECT_EQ(logged("vit_fused_on", "on", vit_on), 1);
  EXPECT_EQ(logged("vit_fused_off", "off", vit_off), 1);
  EXPECT_EQ(logged("swin_fused_on", "on", swin_on), 1);
  EXPECT_EQ(capture_->count(log::Level::info, "model 'vit_tiny': fused_attention"), 0);

  // /active shows the per-model effective value.
  const auto active = http_get(daemon_->http_port(), "/active");
  ASSERT_EQ(active.status, 200);
  for (const std::string& needle :
       {std::string("\"name\": \"vit_fused_on\""), "\"modules_changed\": " + vit_on,
        "\"modules_changed\": " + swin_on, std::string("\"task\": \"image_classification\""),
        std::string("\"value\": \"off\"")}) {
    EXPECT_NE(active.body.find(needle), std::string::npos) << needle << "\n" << active.body;
  }
}

TEST_F(ServerClassifier, PhotographsThroughTheProcessor) {
  // The fixture photographs as encoded JPEGs through decode + ViTImageProcessor (224x224
  // antialiased bilinear, as transformers' torchvision backend): the logits come out within
  // 1e-6 of transformers' here (printed), so they are held to the same 1e-4 as exact pixels.
  rpc::Client c(*address_);
  for (const auto& [model, images] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"vit_tiny", {"astronaut.jpg", "coffee.jpg"}},
           {"swin_tiny", {"chelsea.jpg", "coffee.jpg"}},
           {"deit_tiny", {"astronaut.jpg", "coffee.jpg"}}}) {  // bicubic 256, center crop 224
    std::vector<std::string> jpegs;
    for (const auto& f : images) jpegs.push_back(read_file(kFixtures + "/images/" + f));
    auto r = c.infer("model_name: \"" + model +
                         "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 2 } "
                         "parameters { key: \"top_k\" value { int64_param: 3 } }",
                     {rpc::pack_bytes(jpegs)});
    ASSERT_TRUE(r.ok()) << model << ": " << r.message;
    const auto logits = tensor_of(r.output("logits"));
    const auto probs = tensor_of(r.output("probabilities"));
    const double d = max_abs_diff(logits, expected(model, "logits"));
    const double d_sum = (probs.sum(-1) - 1.0).abs().max().item<double>();
    std::cout << "[" << model << " JPEG] max|logits - transformers logits| = " << d
              << ", max|sum(probabilities) - 1| = " << d_sum << "\n";
    EXPECT_LE(d, 1e-4) << model;
    EXPECT_LE(d_sum, 1e-5) << model;
    EXPECT_EQ(r.output("scores").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(r.output("labels").shape, (std::vector<int64_t>{2, 3}));
    const auto names = unpack(r.output("label_names").data);
    const auto labels = values<int64_t>(r.output("labels").data);
    ASSERT_EQ(names.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(names[i], "LABEL_" + std::to_string(labels[i]));
  }
  // top_k above C is capped at C; a subset of outputs on request.
  auto r = c.infer(
      "model_name: \"vit_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: "
      "1 } parameters { key: \"top_k\" value { int64_param: 50 } } "
      "outputs { name: \"label_names\" }",
      {rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")})});
  ASSERT_TRUE(r.ok()) << r.message;
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.output("label_names").shape, (std::vector<int64_t>{1, 5}));
}

TEST_F(ServerClassifier, ConcurrentRequestsBatchTogether) {
  // Four one-image requests of photographs of different sizes: ViTImageProcessor resizes each to
  // 224x224, so the batcher runs them as one batch of 4 (it closes the window when full).
  const std::vector<std::string> files = {"astronaut.jpg", "coffee.jpg", "astronaut.jpg",
                                          "coffee.jpg"};
  std::vector<std::future<rpc::InferResult>> futures;
  for (const auto& f : files) {
    futures.push_back(std::async(std::launch::async, [f] {
      rpc::Client c(*address_);
      return c.infer(
          "model_name: \"vit_batching\" inputs { name: \"images\" datatype: \"BYTES\" "
          "shape: 1 }",
          {rpc::pack_bytes({read_file(kFixtures + "/images/" + f)})});
    }));
  }
  const auto ref = expected("vit_tiny", "logits");  // rows: astronaut, coffee
  double worst = 0;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    auto r = futures[i].get();
    ASSERT_TRUE(r.ok()) << r.message;
    const auto logits = tensor_of(r.output("logits"));
    ASSERT_EQ(logits.sizes(), (at::IntArrayRef{1, 5}));
    worst = std::max(worst, max_abs_diff(logits[0], ref[static_cast<int64_t>(i % 2)]));
  }
  std::cout << "[vit_batching] 4 concurrent requests: max|logits - transformers logits| = " << worst
            << "\n";
  EXPECT_LE(worst, 1e-4);
  rpc::Client c(*address_);
  auto stats = c.call("ModelStatistics", "name: \"vit_batching\"");
  ASSERT_TRUE(stats.ok()) << stats.message;
  EXPECT_NE(stats.text.find("batch_size: 4"), std::string::npos) << stats.text;
  EXPECT_NE(stats.text.find("execution_count: 1\n"), std::string::npos) << stats.text;
}

TEST_F(ServerClassifier, MetadataAndConfigDescribeAClassifier) {
  rpc::Client c(*address_);
  auto r = c.call("ModelMetadata", "name: \"vit_tiny\"");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("platform: \"libreyolo_vit\""), std::string::npos) << r.text;
  for (const char* needle : {"name: \"images\"\n  datatype: \"BYTES\"\n  shape: -1\n",
                             "name: \"pixel_values\"\n  datatype: \"FP32\"\n  shape: -1\n  shape: "
                             "3\n  shape: -1\n  shape: -1\n",
                             "name: \"logits\"\n  datatype: \"FP32\"\n  shape: -1\n  shape: 5\n",
                             "name: \"probabilities\"\n  datatype: \"FP32\"\n  shape: -1\n  "
                             "shape: 5\n",
                             "name: \"scores\"\n  datatype: \"FP32\"\n  shape: -1\n  shape: -1\n",
                             "name: \"labels\"\n  datatype: \"INT64\"\n  shape: -1\n  shape: -1\n",
                             "name: \"label_names\"\n  datatype: \"BYTES\"\n  shape: -1\n  shape: "
                             "-1\n"}) {
    EXPECT_NE(r.text.find(needle), std::string::npos) << needle << "\n" << r.text;
  }
  for (const char* absent : {"boxes", "target_sizes", "num_detections", "pred_boxes"}) {
    EXPECT_EQ(r.text.find(absent), std::string::npos) << absent << "\n" << r.text;
  }
  r = c.call("ModelMetadata", "name: \"swin_tiny\"");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("platform: \"libreyolo_swin\""), std::string::npos) << r.text;

  r = c.call("ModelConfig", "name: \"vit_tiny\"");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("max_batch_size: 4\n"), std::string::npos) << r.text;
  EXPECT_TRUE(has_parameter(r.text, "task", "image_classification")) << r.text;
  EXPECT_EQ(r.text.find("threshold"), std::string::npos) << r.text;  // detectors only
  EXPECT_NE(r.text.find("name: \"probabilities\"\n    data_type: TYPE_FP32\n    dims: 5\n"),
            std::string::npos)
      << r.text;
}

TEST_F(ServerClassifier, BadServingYamlAndBadInputs) {
  rpc::Client c(*address_);
  auto r = c.call("RepositoryIndex");
  ASSERT_TRUE(r.ok()) << r.message;
  const std::string reason = repo_->string() +
                             "/vit_bad/serving.yaml:2:18: fused_attention must be default, on or "
                             "off, got 'maybe'";
  // Protobuf text format escapes the quotes of the reason.
  std::string escaped = reason;
  for (std::size_t at = 0; (at = escaped.find('\'', at)) != std::string::npos; at += 2)
    escaped.insert(at, "\\");
  EXPECT_NE(r.text.find("name: \"vit_bad\"\n  version: \"1\"\n  state: \"UNAVAILABLE\"\n  "
                        "reason: \"" +
                        escaped + "\""),
            std::string::npos)
      << r.text;
  EXPECT_EQ(c.call("ServerReady").text, "");  // one model failed: not ready
  const auto pv = fixture_pixels("vit_tiny");
  auto i = c.infer(pixels_request("vit_bad", pv), {raw_of(pv)});
  EXPECT_EQ(i.code, Code::unavailable);
  EXPECT_NE(i.message.find(reason), std::string::npos) << i.message;

  const auto jpg = read_file(kFixtures + "/images/coffee.jpg");
  struct Bad {
    std::string text;
    std::vector<std::string> raw;
    std::string message;
  };
  const std::string images = "inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } ";
  for (const auto& b : std::vector<Bad>{
           {"model_name: \"vit_tiny\" " + images +
                "inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] }",
            {rpc::pack_bytes({jpg}), std::string(16, '\0')},
            "unexpected input 'target_sizes' (a classifier takes images (BYTES [N]) or "
            "pixel_values (FP32 [N,3,H,W]))"},
           {"model_name: \"vit_tiny\" " + images + "outputs { name: \"boxes\" }",
            {rpc::pack_bytes({jpg})},
            "unknown output 'boxes' (available: logits, probabilities, scores, labels, "
            "label_names)"},
           {"model_name: \"vit_tiny\" " + images +
                "parameters { key: \"top_k\" value { int64_param: -3 } }",
            {rpc::pack_bytes({jpg})},
            "parameter 'top_k' must be an integer from 0 to 1000000000 (0: the model's default), "
            "got -3"},
           {"model_name: \"vit_tiny\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: "
            "[1, 3, 8, 8] }",
            {std::string(10, '\0')},
            "input 'pixel_values': shape [1,3,8,8] needs 768 bytes of FP32, got 10"},
           {"model_name: \"vit_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: 5 }",
            {rpc::pack_bytes(std::vector<std::string>(5, jpg))},
            "input 'images': batch of 5 exceeds the model's max_batch_size 4"},
           {"model_name: \"vit_tiny\" " + images,
            {rpc::pack_bytes({jpg.substr(0, 300)})},
            "input 'images': image 0:"},
       }) {
    auto bad = c.infer(b.text, b.raw);
    EXPECT_EQ(bad.code, Code::invalid_argument) << b.text << ": " << bad.message;
    EXPECT_NE(bad.message.find(b.message), std::string::npos) << bad.message;
  }
  // A picture smaller than one patch through pixel_values: the model refuses it.
  const auto tiny = at::zeros({1, 3, 8, 8});
  auto t = c.infer(pixels_request("vit_tiny", tiny), {raw_of(tiny)});
  EXPECT_EQ(t.code, Code::invalid_argument) << t.message;
  // Still serving.
  auto ok = c.infer("model_name: \"vit_tiny\" " + images, {rpc::pack_bytes({jpg})});
  EXPECT_TRUE(ok.ok()) << ok.message;
}

// ---- serving.yaml `fused_attention` and the server's kernels.fused_attention ---------------

TEST(ServerClassifierPolicy, ServerFusedAttentionAppliesToEveryModelWithoutItsOwnValue) {
  const auto repo = temp_dir("classifier-policy");
  add_fixture_model(repo, "vit_tiny", "vit_tiny", "warmup: false\n");
  add_fixture_model(repo, "vit_fused_off", "vit_tiny", "warmup: false\nfused_attention: off\n");
  {
    Daemon daemon(test_config(repo, "kernels:\n  fused_attention: on\n"));
    daemon.start();
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()));
    const bool vit_default = fused_default("vit");
    auto r = c.call("ModelConfig", "name: \"vit_tiny\"");
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention", "on")) << r.text;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention_source", "server")) << r.text;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention_modules_changed",
                              changed(true, vit_default, kVitAttention)))
        << r.text;
    r = c.call("ModelConfig", "name: \"vit_fused_off\"");  // serving.yaml wins
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention", "off")) << r.text;
    EXPECT_TRUE(has_parameter(r.text, "fused_attention_modules_changed",
                              changed(false, vit_default, kVitAttention)))
        << r.text;
    const auto active = http_get(daemon.http_port(), "/active");
    EXPECT_NE(active.body.find("\"source\": \"server\""), std::string::npos) << active.body;
    // The outputs stay those of transformers on the SDPA path.
    const auto pv = fixture_pixels("vit_tiny");
    auto i = c.infer(pixels_request("vit_tiny", pv), {raw_of(pv)});
    ASSERT_TRUE(i.ok()) << i.message;
    const double d = max_abs_diff(tensor_of(i.output("logits")), expected("vit_tiny", "logits"));
    std::cout << "[vit_tiny, kernels.fused_attention: on] max|logits - transformers logits| = " << d
              << "\n";
    EXPECT_LE(d, 1e-4);
  }
  remove_tree(repo);
}

TEST(ServingConfigClassifier, FusedAttentionKey) {
  using kernels::FusedAttention;
  EXPECT_EQ(parse_serving_config("", "s.yaml").fused_attention, FusedAttention::family_default);
  for (const auto& [text, want] : std::vector<std::pair<std::string, FusedAttention>>{
           {"fused_attention: default", FusedAttention::family_default},
           {"fused_attention: on", FusedAttention::on},
           {"fused_attention: \"on\"", FusedAttention::on},
           {"fused_attention: true", FusedAttention::on},
           {"fused_attention: OFF", FusedAttention::off},
           {"fused_attention: false", FusedAttention::off}}) {
    const auto s = parse_serving_config("max_batch_size: 2\n" + text + "\n", "m/serving.yaml");
    EXPECT_EQ(s.fused_attention, want) << text;
    EXPECT_EQ(s.fused_attention_origin, "m/serving.yaml:2:18") << text;
  }
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"fused_attention: maybe\n",
            "m/serving.yaml:1:18: fused_attention must be default, on or off, got 'maybe'"},
           {"fused_attention: [on]\n",
            "m/serving.yaml:1:18: fused_attention must be default, on or off, got 'a "
            "non-scalar'"}}) {
    try {
      parse_serving_config(text, "m/serving.yaml");
      ADD_FAILURE() << "no error for " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

TEST(ServingConfigClassifier, ServerFusedAttentionAppliesUnlessServingYamlSetsIt) {
  const std::string dir = kFixtures + "/models/vit_tiny";
  const ModelLoader loader = [](const std::string& d, const models::LoadOptions& o) {
    return models::load_model(d, o);
  };
  using kernels::FusedAttention;
  ServingConfig serving;
  auto m = load_model_version({"v", "1", dir, serving, test_device(), FusedAttention::on}, loader);
  EXPECT_STREQ(m->task->name(), "image_classification");
  EXPECT_EQ(m->model->description().num_labels, 5);
  EXPECT_EQ(m->fused_attention, FusedAttention::on);
  EXPECT_EQ(m->fused_attention_source, "server");
  const bool vit_default = fused_default("vit");
  EXPECT_EQ(std::to_string(m->fused_attention_changed), changed(true, vit_default, kVitAttention));
  // serving.yaml wins over the server.
  serving = parse_serving_config("fused_attention: off\n", "v/serving.yaml");
  m = load_model_version({"v", "1", dir, serving, test_device(), FusedAttention::on}, loader);
  EXPECT_EQ(m->fused_attention, FusedAttention::off);
  EXPECT_EQ(m->fused_attention_source, "serving.yaml v/serving.yaml:1:18");
  EXPECT_EQ(std::to_string(m->fused_attention_changed), changed(false, vit_default, kVitAttention));
  serving = parse_serving_config("fused_attention: on\n", "v/serving.yaml");
  m = load_model_version({"v", "1", dir, serving, test_device(), FusedAttention::off}, loader);
  EXPECT_EQ(m->fused_attention, FusedAttention::on);
  EXPECT_EQ(std::to_string(m->fused_attention_changed), changed(true, vit_default, kVitAttention));
  // Exactly one of on/off changes something: the count differs between the two settings.
  EXPECT_NE(changed(true, vit_default, kVitAttention), changed(false, vit_default, kVitAttention));
  // Both default, float32: the flags stay as loaded, nothing is called.
  serving = parse_serving_config("dtype: float32\n", "v/serving.yaml");
  m = load_model_version({"v", "1", dir, serving, test_device()}, loader);
  EXPECT_EQ(m->fused_attention, FusedAttention::family_default);
  EXPECT_EQ(m->fused_attention_source, "family default");
  EXPECT_EQ(m->fused_attention_changed, 0);
  EXPECT_FALSE(m->flush_denormals);  // float32 keeps IEEE denormals
  warm_up(*m);                       // a classifier warms up on zeros at the processor's 224x224
  // Both default, bfloat16 (what the device rule picks on AMX / AVX-512 BF16 CPUs): fused, on
  // the CPU as on CUDA (models::layers::fused_attention_by_default).
  serving = parse_serving_config("dtype: bfloat16\n", "v/serving.yaml");
  m = load_model_version({"v", "1", dir, serving, test_device()}, loader);
  EXPECT_EQ(m->fused_attention, FusedAttention::on);
  EXPECT_EQ(m->fused_attention_source,
            "default for " + m->device.str() + " bfloat16 (float32 keeps the family default)");
  EXPECT_EQ(std::to_string(m->fused_attention_changed), changed(true, vit_default, kVitAttention));
  // A CPU bfloat16 model's instance threads flush denormals (models/runtime/cpu_math.h).
  EXPECT_EQ(m->flush_denormals, m->device.is_cpu());
  warm_up(*m);
}

}  // namespace
}  // namespace libreyolo::server
