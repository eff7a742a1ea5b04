// Instance segmentation served: a fake segmenter (server_test_support.h) behind the
// real daemon, over gRPC and REST: the detections plus `masks` UINT8 [N,K,H,W] at the target
// size, equal to image::post_process_instance_segmentation of the same outputs (whose parity with
// transformers is tests/parity/instance_segmentation_parity_test.cpp), or COCO RLE with
// `mask_format: rle`; exact errors for bad mask parameters; ModelMetadata lists the outputs.
// Then the real RF-DETR example (examples/model_repository/rf_detr_seg_tiny): a photograph
// through RfDetrImageProcessor and RfDetrForInstanceSegmentation, its masks equal to the
// library's own pipeline on the same photograph.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>

#include "models/image/decode.h"
#include "models/image/instance_segmentation.h"
#include "models/image/processor.h"
#include "server/app/daemon.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

// pixel_values [1,3,8,8] (masks 4x4 -> the 8x8 original size), optional target_sizes.
std::string pv_request(const std::string& extra = "") {
  return "model_name: \"seg\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, "
         "8] } " +
         extra;
}
const std::string kPixels(3 * 8 * 8 * 4, '\0');

class ServerSegmentation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("segmentation"));
    add_fake_model(*repo_, "seg", "max_batch_size: 2\nthreshold: 0.5\n");
    auto config = loopback_config(*repo_);
    // target_sizes are bounded by the pixel budget (40 M by default: 4 masks of that size stay
    // within the 256 MiB mask budget); a server that raises it meets the mask budget.
    config.max_pixels_per_image.value = 400000000;
    daemon_ = new Daemon(
        config,
        [](const std::string&, const models::LoadOptions& o) -> std::unique_ptr<models::Model> {
          return std::make_unique<FakeSegmenter>(o);
        });
    daemon_->start();
  }
  static void TearDownTestSuite() {
    daemon_->stop(1.0);
    delete daemon_;
    remove_tree(*repo_);
    delete repo_;
  }
  rpc::Client client() { return rpc::Client("127.0.0.1:" + std::to_string(daemon_->grpc_port())); }

  /// What the post-processing gives for the fake's outputs at `size`.
  static image::InstanceMasks expected(std::pair<int64_t, int64_t> size) {
    FakeSegmenter fake;
    const auto out = fake.forward(at::zeros({1, 3, 8, 8}), at::Tensor());
    image::InstanceSegmentationOptions o;
    o.threshold = 0.5;
    return image::post_process_instance_segmentation(out.logits, out.pred_boxes, out.pred_masks,
                                                     {size}, o)[0];
  }

  static fs::path* repo_;
  static Daemon* daemon_;
};
fs::path* ServerSegmentation::repo_ = nullptr;
Daemon* ServerSegmentation::daemon_ = nullptr;

TEST_F(ServerSegmentation, BinaryMasksAtTheOriginalSizeByDefault) {
  auto c = client();
  const auto r = c.infer(pv_request(), {kPixels});
  ASSERT_TRUE(r.ok()) << r.message;
  const auto want = expected({8, 8});
  // Queries 0-2 have a mask, query 3's is empty: 3 instances of the 4 detections above 0.5.
  ASSERT_EQ(want.masks.size(0), 3);
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{3});
  const auto& masks = r.output("masks");
  EXPECT_EQ(masks.datatype, "UINT8");
  EXPECT_EQ(masks.shape, (std::vector<int64_t>{1, 3, 8, 8}));
  const at::Tensor m = want.masks.to(at::kByte).contiguous();
  EXPECT_EQ(masks.data, std::string(reinterpret_cast<const char*>(m.data_ptr<uint8_t>()), 3 * 64));
  // Column q of the 4x4 logits covers columns 2q-1 .. 2q+1 of the 8x8 mask after the bilinear
  // resize: the masks differ and are not empty.
  for (int64_t k = 0; k < 3; ++k) EXPECT_GT(m[k].sum().item<int64_t>(), 0) << k;
  EXPECT_FALSE(at::equal(m[0], m[1]));
  // The default outputs: the detector's plus masks, no RLE.
  std::set<std::string> names;
  for (const auto& o : r.outputs) names.insert(o.name);
  EXPECT_EQ(names, (std::set<std::string>{"scores", "labels", "boxes", "num_detections",
                                          "label_names", "masks"}));
}

TEST_F(ServerSegmentation, RleFormatAndTargetSizes) {
  auto c = client();
  const std::vector<int64_t> size = {5, 12};
  const auto r =
      c.infer(pv_request("inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] } "
                         "parameters { key: \"mask_format\" value { string_param: \"rle\" } }"),
              {kPixels, std::string(reinterpret_cast<const char*>(size.data()), 16)});
  ASSERT_TRUE(r.ok()) << r.message;
  const auto want = expected({5, 12});
  const auto& counts = r.output("rle_counts");
  ASSERT_EQ(counts.shape.size(), 3u);
  EXPECT_EQ(counts.shape[0], 1);
  EXPECT_EQ(counts.shape[1], want.masks.size(0));
  const auto flat = values<int64_t>(counts.data);
  const int64_t width = counts.shape[2];
  for (int64_t k = 0; k < want.masks.size(0); ++k) {
    const auto rle = image::coco_rle_counts(want.masks[k]);
    std::vector<int64_t> row(flat.begin() + k * width, flat.begin() + (k + 1) * width);
    for (std::size_t j = rle.size(); j < row.size(); ++j) EXPECT_EQ(row[j], -1) << "padding";
    row.resize(rle.size());
    EXPECT_EQ(row, rle) << "mask " << k;
  }
  EXPECT_EQ(values<int64_t>(r.output("rle_size").data), (std::vector<int64_t>{5, 12}));
  EXPECT_THROW(r.output("masks"), std::out_of_range);
}

TEST_F(ServerSegmentation, BadMaskParametersAreInvalidArgumentNamingThem) {
  auto c = client();
  struct Case {
    std::string params, message;
  };
  const std::vector<Case> cases = {
      {"parameters { key: \"mask_format\" value { string_param: \"png\" } }",
       "parameter 'mask_format' must be \"binary\" or \"rle\", got \"png\""},
      {"parameters { key: \"mask_format\" value { int64_param: 1 } }",
       "parameter 'mask_format' must be \"binary\" or \"rle\", got a int64"},
      {"parameters { key: \"mask_threshold\" value { double_param: inf } }",
       "parameter 'mask_threshold' must be a finite number, got inf"},
      {"outputs { name: \"mask\" }",
       "unknown output 'mask' (available: scores, labels, boxes, num_detections, label_names, "
       "logits, pred_boxes, masks, rle_counts, rle_size)"},
  };
  for (const auto& k : cases) {
    const auto r = c.infer(pv_request(k.params), {kPixels});
    EXPECT_EQ(r.code, Code::invalid_argument) << k.params;
    EXPECT_NE(r.message.find(k.message), std::string::npos) << r.message;
  }
  // mask_threshold 2.9 keeps the +3 logits' neighbourhood only: fewer pixels than 0.
  const auto loose = c.infer(pv_request(), {kPixels});
  const auto tight = c.infer(
      pv_request("parameters { key: \"mask_threshold\" value { double_param: 2.9 } }"), {kPixels});
  ASSERT_TRUE(loose.ok() && tight.ok()) << tight.message;
  auto ones = [](const std::string& d) {
    int64_t n = 0;
    for (char ch : d) n += ch != 0;
    return n;
  };
  EXPECT_LT(ones(tight.output("masks").data), ones(loose.output("masks").data));
}

TEST_F(ServerSegmentation, MasksBeyondTheBudgetAreResourceExhaustedForThatRequestOnly) {
  auto c = client();
  const std::vector<int64_t> huge = {20000, 20000};
  const auto r =
      c.infer(pv_request("inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [1, 2] }"),
              {kPixels, std::string(reinterpret_cast<const char*>(huge.data()), 16)});
  EXPECT_EQ(r.code, Code::resource_exhausted);
  EXPECT_NE(r.message.find("post_process_instance_segmentation: 4 instances make 1600000000 "
                           "mask pixels, above the limit of 268435456 (raise 'threshold', lower "
                           "'top_k' or ask smaller 'target_sizes')"),
            std::string::npos)
      << r.message;
  // The model keeps serving.
  EXPECT_TRUE(c.infer(pv_request(), {kPixels}).ok());
}

// libreyolo-client segment: the detections with their mask sizes, and --out writes the photo
// with every mask painted over it: the pixels it changed are mask pixels, most mask pixels
// changed.
TEST_F(ServerSegmentation, ClientSegmentWritesTheOverlay) {
  const auto dir = temp_dir("overlay");
  const std::string photo = std::string(LIBREYOLO_TEST_FIXTURES) + "/images/coffee.jpg";
  const std::string png = (dir / "overlay.png").string(), log = (dir / "log.txt").string();
  const std::string cmd = std::string(LIBREYOLO_BINARY_DIR) +
                          "/bin/libreyolo-client segment --model seg --image " + photo + " --out " +
                          png + " --server 127.0.0.1:" + std::to_string(daemon_->grpc_port()) +
                          " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log);
  const std::string printed = read_file(log);
  EXPECT_NE(printed.find(": 3 detections (model seg version 1)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("wrote " + png + " (3 masks over " + photo + ")"), std::string::npos)
      << printed;
  const std::string jpg = read_file(photo), out = read_file(png);
  const auto before = image::decode_rgb(reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size());
  const auto after = image::decode_rgb(reinterpret_cast<const uint8_t*>(out.data()), out.size());
  ASSERT_EQ(after.height, before.height);
  ASSERT_EQ(after.width, before.width);
  const at::Tensor any = expected({before.height, before.width}).masks.any(0).contiguous();
  const auto* inside = any.data_ptr<bool>();
  int64_t changed = 0, changed_outside = 0, mask_pixels = 0;
  for (int64_t p = 0; p < before.height * before.width; ++p) {
    const bool differs = before.rgb[p * 3] != after.rgb[p * 3] ||
                         before.rgb[p * 3 + 1] != after.rgb[p * 3 + 1] ||
                         before.rgb[p * 3 + 2] != after.rgb[p * 3 + 2];
    changed += differs;
    changed_outside += differs && !inside[p];
    mask_pixels += inside[p];
  }
  EXPECT_EQ(changed_outside, 0);
  EXPECT_GT(changed, mask_pixels * 9 / 10) << changed << " of " << mask_pixels;
  remove_tree(dir);
}

TEST_F(ServerSegmentation, MetadataAndRestReportTheTask) {
  auto c = client();
  const auto meta = c.call("ModelMetadata", "name: \"seg\"").text;
  EXPECT_NE(meta.find("name: \"masks\"\n  datatype: \"UINT8\""), std::string::npos) << meta;
  EXPECT_NE(meta.find("name: \"rle_counts\""), std::string::npos) << meta;
  const auto active =
      nlohmann::json::parse(http_get(daemon_->http_port(), "/active").body).at("models")[0];
  EXPECT_EQ(active.at("task"), "instance_segmentation");
  // REST (KServe v2 JSON): the masks come back as UINT8 data.
  const std::string body =
      R"({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": [)" +
      [] {
        std::string z;
        for (int i = 0; i < 192; ++i) z += i ? ",0" : "0";
        return z;
      }() +
      R"(]}], "outputs": [{"name": "masks"}]})";
  const auto r = http_request(daemon_->http_port(), "POST", "/v2/models/seg/infer", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = nlohmann::json::parse(r.body);
  ASSERT_EQ(j.at("outputs").size(), 1u);
  EXPECT_EQ(j.at("outputs")[0].at("datatype"), "UINT8");
  EXPECT_EQ(j.at("outputs")[0].at("shape"), nlohmann::json::parse("[1, 3, 8, 8]"));
  EXPECT_EQ(j.at("outputs")[0].at("data").size(), 192u);
}

class ServerRfDetrSegmentation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("rf_detr_seg"));
    // The example repository's RF-DETR models (the same files as the parity fixtures).
    for (const char* name : {"rf_detr_seg_tiny", "rf_detr_tiny"}) {
      fs::create_directories(*repo_ / name);
      fs::copy(fs::path(LIBREYOLO_SOURCE_DIR) / "examples/model_repository" / name, *repo_ / name,
               fs::copy_options::recursive);
    }
    daemon_ = new Daemon(loopback_config(*repo_));
    daemon_->start();
  }
  static void TearDownTestSuite() {
    daemon_->stop(1.0);
    delete daemon_;
    remove_tree(*repo_);
    delete repo_;
  }
  static fs::path* repo_;
  static Daemon* daemon_;
};
fs::path* ServerRfDetrSegmentation::repo_ = nullptr;
Daemon* ServerRfDetrSegmentation::daemon_ = nullptr;

TEST_F(ServerRfDetrSegmentation, PhotographMasksEqualTheLibraryPipeline) {
  const fs::path dir =
      fs::path(LIBREYOLO_SOURCE_DIR) / "examples/model_repository/rf_detr_seg_tiny/1";
  const std::string photo = std::string(LIBREYOLO_TEST_FIXTURES) + "/images/coffee.jpg";
  // The library pipeline: decode, RfDetrImageProcessor, forward, post-processing at 0.5 (the
  // example's serving.yaml threshold).
  image::InstanceMasks want;
  {
    c10::InferenceMode guard;
    const auto model = models::load_model(dir.string());
    const image::ImageProcessor proc(
        image::ProcessorConfig::from_file((dir / "preprocessor_config.json").string()));
    const auto in = proc.preprocess({image::decode_image_file(photo)});
    const auto out = model->forward(in.pixel_values, in.pixel_mask);
    image::InstanceSegmentationOptions o;
    o.threshold = 0.5;
    want = image::post_process_instance_segmentation(out.logits, out.pred_boxes, out.pred_masks,
                                                     in.original_sizes, o)[0];
  }
  const int64_t k = want.masks.size(0);
  ASSERT_EQ(k, 12);  // tests/fixtures/models/rf_detr_seg_tiny/meta.json: 12 instances
  rpc::Client c("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  const auto r = c.infer(
      "model_name: \"rf_detr_seg_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
      {rpc::pack_bytes({read_file(photo)})});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{12});
  EXPECT_EQ(values<int64_t>(r.output("labels").data),
            std::vector<int64_t>(want.detections.labels.data_ptr<int64_t>(),
                                 want.detections.labels.data_ptr<int64_t>() + k));
  const auto& masks = r.output("masks");
  EXPECT_EQ(masks.shape, (std::vector<int64_t>{1, k, 400, 600}));
  const at::Tensor m = want.masks.to(at::kByte).contiguous();
  EXPECT_TRUE(masks.data == std::string(reinterpret_cast<const char*>(m.data_ptr<uint8_t>()),
                                        static_cast<size_t>(m.numel())))
      << "masks differ";
  const auto meta = c.call("ModelMetadata", "name: \"rf_detr_seg_tiny\"").text;
  EXPECT_NE(meta.find("name: \"masks\""), std::string::npos) << meta;
}

TEST_F(ServerRfDetrSegmentation, DetectionExampleEqualsTheLibraryPipeline) {
  // rf_detr_tiny (object detection) through the same daemon: scores, labels and boxes of a
  // photograph equal decode + RfDetrImageProcessor + forward + post_process_object_detection.
  const fs::path dir = fs::path(LIBREYOLO_SOURCE_DIR) / "examples/model_repository/rf_detr_tiny/1";
  const std::string photo = std::string(LIBREYOLO_TEST_FIXTURES) + "/images/astronaut.jpg";
  image::Detections want;
  {
    c10::InferenceMode guard;
    const auto model = models::load_model(dir.string());
    EXPECT_EQ(model->task(), models::Task::object_detection);
    const image::ImageProcessor proc(
        image::ProcessorConfig::from_file((dir / "preprocessor_config.json").string()));
    const auto in = proc.preprocess({image::decode_image_file(photo)});
    const auto out = model->forward(in.pixel_values, in.pixel_mask);
    image::PostProcessOptions o;
    o.threshold = 0.5;
    want = image::post_process_object_detection(out.logits, out.pred_boxes, in.original_sizes,
                                                model->description().head, o)[0];
  }
  ASSERT_EQ(want.scores.numel(), 12);  // rf_detr_tiny/meta.json: 12 detections above 0.3
  rpc::Client c("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  const auto r = c.infer(
      "model_name: \"rf_detr_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }",
      {rpc::pack_bytes({read_file(photo)})});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{12});
  EXPECT_EQ(
      values<int64_t>(r.output("labels").data),
      std::vector<int64_t>(want.labels.data_ptr<int64_t>(), want.labels.data_ptr<int64_t>() + 12));
  EXPECT_EQ(values<float>(r.output("scores").data),
            std::vector<float>(want.scores.data_ptr<float>(), want.scores.data_ptr<float>() + 12));
  const at::Tensor boxes = want.boxes.contiguous();
  EXPECT_EQ(values<float>(r.output("boxes").data),
            std::vector<float>(boxes.data_ptr<float>(), boxes.data_ptr<float>() + 48));
  EXPECT_THROW(r.output("masks"), std::out_of_range);
}

}  // namespace
}  // namespace libreyolo::server
