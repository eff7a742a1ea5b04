// Image pre-processing and detection post-processing against the transformers fixtures
// (tests/fixtures/models/*/expected.safetensors, meta.json). No model weights are needed:
// preprocessing starts from the fixture JPEGs, post-processing from the stored logits/pred_boxes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/core/safetensors.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/support/tensor_diff.h"

namespace {

namespace fs = std::filesystem;
using libreyolo::image::DetectionHead;
using libreyolo::image::ImageProcessor;
using libreyolo::image::ProcessorConfig;
using libreyolo::models::core::SafetensorsFile;

const fs::path kFixtures = LIBREYOLO_TEST_FIXTURES;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(f);
}

// Every model fixture folder that has the files this test needs.
std::vector<fs::path> model_dirs() {
  std::vector<fs::path> out;
  const fs::path root = kFixtures / "models";
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (fs::exists(e.path() / "expected.safetensors") && fs::exists(e.path() / "meta.json") &&
        fs::exists(e.path() / "preprocessor_config.json"))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct U8Stats {
  int64_t total = 0, equal = 0, max_diff = 0;
};

U8Stats compare_u8(const at::Tensor& ours, const at::Tensor& ref) {
  const at::Tensor d = (ours.to(at::kInt) - ref.to(at::kInt)).abs();
  U8Stats s;
  s.total = d.numel();
  s.equal = d.eq(0).sum().item<int64_t>();
  s.max_diff = d.max().item<int>();
  return s;
}

libreyolo::image::ProcessorOutput preprocess_fixture(const fs::path& dir,
                                                     ProcessorConfig::Uint8Resize mode) {
  ProcessorConfig cfg = ProcessorConfig::from_file((dir / "preprocessor_config.json").string());
  cfg.uint8_resize = mode;
  const ImageProcessor proc(cfg);
  std::vector<at::Tensor> images;
  const nlohmann::json meta = read_json(dir / "meta.json");
  for (const auto& name : meta.at("images")) {
    images.push_back(libreyolo::image::decode_image_file(
        (kFixtures / "images" / name.get<std::string>()).string()));
  }
  return proc.preprocess(images);
}

TEST(ImagePreprocessParity, PixelU8MatchesTransformersFixtures) {
  const auto dirs = model_dirs();
  ASSERT_GE(dirs.size(), 4u) << "copy the model fixtures into " << kFixtures;
  int rf_detr = 0, owl = 0;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    auto expected = SafetensorsFile::open((dir / "expected.safetensors").string());
    // RfDetrImageProcessor rescales and normalises before it resizes in float32: there is no
    // uint8 image to compare (its pixel_values are compared bit for bit in
    // rf_detr_parity_test.cpp).
    if (ProcessorConfig::from_file((dir / "preprocessor_config.json").string())
            .image_processor_type == "RfDetrImageProcessor") {
      EXPECT_FALSE(expected->contains("pixel_u8"));
      ++rf_detr;
      continue;
    }
    // OWL-ViT / OWLv2: the fixtures store pixel_values (Owlv2ImageProcessor blurs and resizes
    // float32: no uint8 image); ours against them (owlvit_parity_test.cpp checks them too).
    const std::string type = ProcessorConfig::from_file((dir / "preprocessor_config.json").string())
                                 .image_processor_type;
    if (type == "OwlViTImageProcessor" || type == "Owlv2ImageProcessor") {
      EXPECT_FALSE(expected->contains("pixel_u8"));
      const auto out = preprocess_fixture(dir, ProcessorConfig::Uint8Resize::automatic);
      EXPECT_LE(libreyolo::test::max_abs_diff(out.pixel_values, expected->view("pixel_values")),
                1e-5);
      ++owl;
      continue;
    }
    const at::Tensor ref = expected->view("pixel_u8");
    const auto out = preprocess_fixture(dir, ProcessorConfig::Uint8Resize::automatic);
    ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
    const U8Stats s = compare_u8(out.pixel_u8, ref);
    const double frac = static_cast<double>(s.equal) / static_cast<double>(s.total);
    std::cout << dir.filename().string() << ": pixel_u8 " << s.equal << "/" << s.total << " equal ("
              << 100.0 * frac << " %), max |diff| " << s.max_diff << "\n";
    EXPECT_GE(frac, 0.99);
    EXPECT_LE(s.max_diff, 1);
    if (expected->contains("pixel_mask")) {
      ASSERT_TRUE(out.pixel_mask.defined());
      EXPECT_TRUE(
          at::equal(out.pixel_mask.to(at::kLong), expected->view("pixel_mask").to(at::kLong)))
          << "pixel_mask differs";
    } else {
      EXPECT_FALSE(out.pixel_mask.defined());
    }
    // pixel_values: the documented exact formulas applied to our pixels, 0 in the padding.
    const ImageProcessor proc(
        ProcessorConfig::from_file((dir / "preprocessor_config.json").string()));
    at::Tensor want = proc.rescale_normalize(out.pixel_u8);
    if (out.pixel_mask.defined()) want = want * out.pixel_mask.unsqueeze(1);
    EXPECT_TRUE(at::equal(out.pixel_values, want));
  }
  EXPECT_EQ(rf_detr, 2);  // rf_detr_tiny, rf_detr_seg_tiny
  EXPECT_EQ(owl, 2);      // owlvit_tiny, owlv2_tiny
}

// torchvision's float32 -> round path (its choice on AVX512 CPUs) is NOT what the fixtures
// hold: measured here so that a change of the reference machine shows up.
TEST(ImagePreprocessParity, Float32RoundResizeDiffersByAtMostOne) {
  const fs::path dir = kFixtures / "models" / "vit_tiny";
  auto expected = SafetensorsFile::open((dir / "expected.safetensors").string());
  const auto out = preprocess_fixture(dir, ProcessorConfig::Uint8Resize::float32_round);
  const U8Stats s = compare_u8(out.pixel_u8, expected->view("pixel_u8"));
  const double frac = static_cast<double>(s.equal) / static_cast<double>(s.total);
  std::cout << "vit_tiny float32+round resize: pixel_u8 " << 100.0 * frac << " % equal, max |diff| "
            << s.max_diff << "\n";
  EXPECT_LE(s.max_diff, 1);
  EXPECT_LT(frac, 0.99);  // the native uint8 kernel is the reference, not this path
}

// The fused normalize is float32 (x - mean*255f) / (std*255f), not (x/255 - mean)/std.
TEST(ImagePreprocessParity, RescaleNormalizeFormulasAreBitExact) {
  ProcessorConfig dd = ProcessorConfig::from_file(
      (kFixtures / "models" / "deformable_detr_tiny" / "preprocessor_config.json").string());
  const at::Tensor u8 =
      at::arange(256, at::kInt).to(at::kByte).view({1, 1, 256}).expand({3, 1, 256});
  const at::Tensor got = ImageProcessor(dd).rescale_normalize(u8.contiguous());
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float want = (static_cast<float>(v) - mean[c] * 255.0f) / (stdv[c] * 255.0f);
      ASSERT_EQ(got[c][0][v].item<float>(), want) << "c=" << c << " v=" << v;
    }
  }
  ProcessorConfig rt = ProcessorConfig::from_file(
      (kFixtures / "models" / "rtdetr_tiny" / "preprocessor_config.json").string());
  const at::Tensor r = ImageProcessor(rt).rescale_normalize(u8.contiguous());
  for (int v = 0; v < 256; ++v)
    ASSERT_EQ(r[0][0][v].item<float>(), static_cast<float>(v) * 0.00392156862745098f);
}

TEST(PostprocessParity, DetectorsMatchTransformersFixtures) {
  int checked = 0;
  double max_box = 0, max_score = 0;
  for (const auto& dir : model_dirs()) {
    const auto meta = read_json(dir / "meta.json");
    if (!meta.contains("postprocess")) continue;  // classifiers
    SCOPED_TRACE(dir.filename().string());
    const auto config = read_json(dir / "config.json");
    const DetectionHead head = *libreyolo::models::FamilyRegistry::builtin()
                                    .find(config.at("model_type").get<std::string>())
                                    ->head;
    // Document layout: detections in reading order from the order logits too
    // (image::post_process_document_layout; tests/parity/pp_doclayout_v3_parity_test.cpp).
    if (head == DetectionHead::pp_doclayout || head == DetectionHead::pp_doclayout_v2) continue;
    // Open-vocabulary detectors: their post-processing needs the prompts
    // (PromptedDetector::post_process; tests/parity/owlvit_parity_test.cpp).
    if (head == DetectionHead::prompted) continue;
    auto expected = SafetensorsFile::open((dir / "expected.safetensors").string());
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
    for (const char* th : {"0.0", "0.3"}) {
      libreyolo::image::PostProcessOptions opt;
      opt.threshold = std::stod(th);
      const auto dets = libreyolo::image::post_process_object_detection(
          expected->view("logits"), expected->view("pred_boxes"), sizes, head, opt);
      ASSERT_EQ(dets.size(), sizes.size());
      for (size_t i = 0; i < dets.size(); ++i) {
        const std::string key = std::string("th") + th + "_img" + std::to_string(i);
        SCOPED_TRACE(key);
        const at::Tensor s = expected->view(key + "_scores");
        const at::Tensor l = expected->view(key + "_labels");
        const at::Tensor b = expected->view(key + "_boxes");
        ASSERT_EQ(dets[i].scores.numel(), s.numel());
        EXPECT_EQ(s.numel(), meta["postprocess"][key]["count"].get<int64_t>());
        EXPECT_TRUE(at::equal(dets[i].labels, l)) << "labels or their order differ";
        if (s.numel() > 0) {
          const double ds = (dets[i].scores - s).abs().max().item<double>();
          const double db = (dets[i].boxes - b).abs().max().item<double>();
          max_score = std::max(max_score, ds);
          max_box = std::max(max_box, db);
          EXPECT_LE(ds, 1e-5);
          EXPECT_LE(db, 1e-2);
        }
        ++checked;
      }
    }
  }
  std::cout << "post-processing: " << checked << " (model, threshold, image) cases, max |score| "
            << max_score << ", max |box| " << max_box << " px\n";
  EXPECT_GE(checked, 8);
}

// Strict `score > threshold`: a score equal to the threshold is dropped.
TEST(PostprocessParity, ThresholdIsStrictAndBoxesScaleByWidthHeight) {
  // logit 0 -> sigmoid 0.5 exactly.
  const at::Tensor logits = at::tensor({0.0f, -20.0f, 2.0f, -20.0f}).view({1, 2, 2});
  const at::Tensor boxes =
      at::tensor({0.5f, 0.5f, 0.2f, 0.4f, 0.25f, 0.75f, 0.5f, 0.5f}).view({1, 2, 4});
  libreyolo::image::PostProcessOptions opt;
  opt.threshold = 0.5;
  auto d = libreyolo::image::post_process_object_detection(logits, boxes, {{100, 200}},
                                                           DetectionHead::rt_detr, opt);
  ASSERT_EQ(d[0].scores.numel(), 1);  // 0.5 itself is not kept
  EXPECT_EQ(d[0].labels[0].item<int64_t>(), 0);
  // query 1 (cx .25, cy .75, w .5, h .5) on (H=100, W=200): x0 0, y0 50, x1 100, y1 100.
  const at::Tensor want = at::tensor({0.0f, 50.0f, 100.0f, 100.0f});
  EXPECT_TRUE(at::allclose(d[0].boxes[0], want)) << d[0].boxes;
  opt.threshold = 0.4;
  d = libreyolo::image::post_process_object_detection(logits, boxes, {{100, 200}},
                                                      DetectionHead::deformable_detr, opt);
  ASSERT_EQ(d[0].scores.numel(), 2);
  EXPECT_EQ(d[0].labels[1].item<int64_t>(), 0);
  EXPECT_TRUE(at::allclose(d[0].boxes[1], at::tensor({80.0f, 30.0f, 120.0f, 70.0f})));
}

TEST(PostprocessParity, ClassifierSoftmaxTopK) {
  const at::Tensor logits = at::tensor({1.0f, 3.0f, 2.0f, 0.0f}).view({1, 4});
  const auto c = libreyolo::image::classify(logits, 2);
  EXPECT_EQ(c.labels[0][0].item<int64_t>(), 1);
  EXPECT_EQ(c.labels[0][1].item<int64_t>(), 2);
  const double e = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_NEAR(c.scores[0][0].item<float>(), std::exp(3.0) / e, 1e-6);
  EXPECT_EQ(libreyolo::image::label_name({{1, "cat"}}, 1), "cat");
  EXPECT_EQ(libreyolo::image::label_name({{1, "cat"}}, 7), "LABEL_7");
}

}  // namespace
