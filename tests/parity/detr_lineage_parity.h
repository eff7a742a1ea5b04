// The parity checks Conditional DETR and DAB-DETR share: one fixture layout
// (tests/fixtures/models/conditional_detr_tiny/make_fixtures.py makes both): two photographs in
// one padded 96x144 batch with a uint8 pixel_mask, transformers' logits / pred_boxes (SDPA, and
// eager where they differ), ConditionalDetrImageProcessor.post_process_object_detection at
// threshold 0 and at meta.json's calibrated threshold.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo::test {

struct DetrLineageFixture {
  const char* name;        ///< tests/fixtures/models/<name>
  const char* model_type;  ///< Model::model_type()
  int64_t queries, labels;
};

inline std::vector<std::pair<int64_t, int64_t>> lineage_target_sizes(const std::string& dir) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const auto meta = read_json(dir + "/meta.json");  // outlives the loop
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  return sizes;
}

/// Both attention paths against transformers' SDPA outputs and, when the fixture stores them,
/// its eager outputs: logits <= 1e-4, boxes <= 1e-5.
inline void expect_lineage_logits_and_boxes_match(const DetrLineageFixture& f) {
  c10::InferenceMode inference_mode;
  const auto dir = model_fixture(f.name);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), f.model_type);
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), static_cast<size_t>(f.labels));
  EXPECT_EQ(model->description().head, image::DetectionHead::deformable_detr);
  const auto pixels = normalized_pixels(dir);
  const auto mask = expected_mask(dir);
  ASSERT_EQ(pixels.sizes(), (at::IntArrayRef{2, 3, 96, 144}));
  ASSERT_EQ(mask.select(0, 0).sum().item<int64_t>(), 96 * 96);  // image 0 is padded
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  const bool has_eager = file->contains("logits_eager");
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    const auto out = model->forward(pixels, mask);
    ASSERT_EQ(out.logits.sizes(), (at::IntArrayRef{2, f.queries, f.labels}));
    const std::string label = std::string(f.name) + (fused ? " sdpa" : " manual");
    expect_logits_and_boxes_match(out, expected_tensor(dir, "logits"),
                                  expected_tensor(dir, "pred_boxes"), label);
    if (has_eager)
      expect_logits_and_boxes_match(out, expected_tensor(dir, "logits_eager"),
                                    expected_tensor(dir, "pred_boxes_eager"),
                                    label + " vs transformers eager");
  }
}

/// Our post-processing of our outputs against transformers' of its outputs: top-100 of the
/// query-class pairs at threshold 0, some of them at the calibrated threshold; labels equal
/// in order, scores within 1e-5, boxes within 1e-2 px of the original images.
inline void expect_lineage_detections_match(const DetrLineageFixture& f) {
  c10::InferenceMode inference_mode;
  const auto dir = model_fixture(f.name);
  auto model = models::load_model(dir);
  const auto out = model->forward(normalized_pixels(dir), expected_mask(dir));
  const auto sizes = lineage_target_sizes(dir);
  const auto meta = read_json(dir + "/meta.json");
  const double calibrated = meta.at("threshold").get<double>();
  const auto head = *models::FamilyRegistry::builtin().find(f.model_type)->head;
  int64_t kept = 0;
  for (const double th : {0.0, calibrated}) {
    image::PostProcessOptions opt;
    opt.threshold = th;
    const auto dets =
        image::post_process_object_detection(out.logits, out.pred_boxes, sizes, head, opt);
    ASSERT_EQ(dets.size(), 2u);
    for (size_t i = 0; i < dets.size(); ++i) {
      const std::string key = c10::str("th", th == 0.0 ? "0.0" : c10::str(th), "_img", i);
      SCOPED_TRACE(key);
      const auto s = expected_tensor(dir, key + "_scores");
      ASSERT_EQ(dets[i].scores.numel(), s.numel());
      if (th == 0.0) EXPECT_EQ(s.numel(), std::min<int64_t>(100, f.queries * f.labels));
      if (th != 0.0) kept += s.numel();
      EXPECT_TRUE(at::equal(dets[i].labels, expected_tensor(dir, key + "_labels")));
      if (s.numel() == 0) continue;
      EXPECT_LE(max_abs_diff(dets[i].scores, s), 1e-5);
      EXPECT_LE(max_abs_diff(dets[i].boxes, expected_tensor(dir, key + "_boxes")), 1e-2);
    }
  }
  // The fixture calibrates its threshold inside the top-100 scores: some kept, some not.
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 200);
}

/// ConditionalDetrImageProcessor (shortest_edge 96, longest_edge 160): resize within 1 of
/// torchvision's uint8 kernel, the padded batch's pixel_mask exactly.
inline void expect_lineage_processor_matches(const DetrLineageFixture& f) {
  const auto dir = model_fixture(f.name);
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  std::vector<at::Tensor> images;
  const auto meta = read_json(dir + "/meta.json");
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  const auto out = proc.preprocess(images);
  const auto ref = expected_tensor(dir, "pixel_u8");
  ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
  const auto d = (out.pixel_u8.to(at::kInt) - ref.to(at::kInt)).abs();
  const double equal = d.eq(0).sum().item<double>() / static_cast<double>(d.numel());
  std::cout << "[" << f.name << "] pixel_u8 " << 100.0 * equal << " % equal, max |diff| "
            << d.max().item<int>() << "\n";
  EXPECT_GE(equal, 0.99);
  EXPECT_LE(d.max().item<int>(), 1);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(at::equal(out.pixel_mask, expected_mask(dir)));
}

/// float16 / bfloat16 on CPU: float32 outputs close to the float32 model's: logits within
/// `logits_rel_tol` of the float32 logits' largest magnitude (the fixtures' classifier gains make
/// them span tens), boxes within `boxes_tol`.
inline void expect_lineage_half_precision_close(const DetrLineageFixture& f, double logits_rel_tol,
                                                double boxes_tol) {
  c10::InferenceMode inference_mode;
  const auto dir = model_fixture(f.name);
  const auto pixels = normalized_pixels(dir);
  const auto mask = expected_mask(dir);
  const auto ref = models::load_model(dir)->forward(pixels, mask);
  const double logits_tol = logits_rel_tol * ref.logits.abs().max().item<double>();
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_model(dir, options);
    const auto out = model->forward(pixels.to(dtype), mask);
    EXPECT_EQ(out.logits.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(out.logits, model->forward(pixels, mask).logits));
    const double d = max_abs_diff(out.logits, ref.logits);
    const double db = max_abs_diff(out.pred_boxes, ref.pred_boxes);
    std::cout << "[" << f.name << " " << dtype << "] max|logits - float32| = " << d << " (bound "
              << logits_tol << "), max|pred_boxes - float32| = " << db << "\n";
    EXPECT_LE(d, logits_tol);
    EXPECT_LE(db, boxes_tol);
  }
}

/// A temporary folder with `src`'s model.safetensors (a link) and a config.json the test writes.
class ConfigProbe {
 public:
  explicit ConfigProbe(const std::string& src) {
    char tmpl[] = "/tmp/libreyolo_detr_lineage_cfg_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    if (symlink((src + "/model.safetensors").c_str(), (dir_ + "/model.safetensors").c_str()) != 0)
      throw std::runtime_error("symlink failed");
  }
  ~ConfigProbe() {
    std::remove((dir_ + "/config.json").c_str());
    std::remove((dir_ + "/model.safetensors").c_str());
    rmdir(dir_.c_str());
  }
  ConfigProbe(const ConfigProbe&) = delete;
  ConfigProbe& operator=(const ConfigProbe&) = delete;
  const std::string& dir() const { return dir_; }
  /// The load error of `config` (its message), or "(loaded)".
  std::string error_of(const nlohmann::json& config) const {
    std::ofstream(dir_ + "/config.json") << config.dump();
    try {
      models::load_model(dir_);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(loaded)";
  }

 private:
  std::string dir_;
};

}  // namespace libreyolo::test
