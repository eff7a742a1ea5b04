// DeiT (deit_tiny: DeiTForImageClassification, deit_tiny_distilled:
// DeiTForImageClassificationWithTeacher; transformers 5.17, tests/fixtures/models/deit_tiny/
// make_fixtures.py) against the stored reference logits with both of our attention paths, the
// DeiTImageProcessor (resize, center crop) against the stored pixels, and the strict loader's
// errors on a checkpoint with an unknown or a missing key.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/core/safetensors.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/fused_attention_fixtures.h"
#include "tests/support/safetensors_writer.h"

namespace libreyolo {
namespace {

/// The family's registered Family::fused_attention_default.
bool fused_default() {
  return models::FamilyRegistry::builtin().find("deit")->fused_attention_default;
}

struct Fixture {
  const char* name;
  int64_t batch, num_labels, crop;
};
const Fixture kFixtures[] = {{"deit_tiny", 2, 5, 224}, {"deit_tiny_distilled", 3, 7, 160}};

TEST(DeitParity, LogitsMatchTransformersWithBothAttentionPaths) {
  c10::InferenceMode inference_mode;
  for (const auto& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const auto dir = test::model_fixture(f.name);
    auto model = models::load_model(dir);
    ASSERT_EQ(model->model_type(), "deit");
    EXPECT_EQ(model->task(), models::Task::image_classification);
    EXPECT_EQ(model->id2label().size(), static_cast<size_t>(f.num_labels));
    EXPECT_EQ(model->id2label().at(f.num_labels - 1), "LABEL_" + std::to_string(f.num_labels - 1));
    const auto pixels = test::normalized_pixels(dir);
    ASSERT_EQ(pixels.sizes(), (at::IntArrayRef{f.batch, 3, f.crop, f.crop}));
    const auto sdpa_ref = test::expected_tensor(dir, "logits");
    ASSERT_EQ(sdpa_ref.sizes(), (at::IntArrayRef{f.batch, f.num_labels}));
    test::expect_logits_match_both_paths(*model, pixels, sdpa_ref,
                                         test::expected_tensor(dir, "logits_eager"), f.name);
    EXPECT_FALSE(model->forward(pixels).pred_boxes.defined());
  }
}

TEST(DeitParity, WithTeacherLogitsAreTheMeanOfBothHeads) {
  // The stored heads of the distilled fixture: logits = (cls_logits + distillation_logits) / 2,
  // and the two heads differ (the distillation token's head is not a copy).
  const auto dir = test::model_fixture("deit_tiny_distilled");
  const auto cls = test::expected_tensor(dir, "cls_logits");
  const auto dist = test::expected_tensor(dir, "distillation_logits");
  EXPECT_GT(test::max_abs_diff(cls, dist), 0.1);
  c10::InferenceMode inference_mode;
  const auto out = models::load_model(dir)->forward(test::normalized_pixels(dir));
  EXPECT_LE(test::max_abs_diff(out.logits, (cls + dist) / 2), 1e-4);
  EXPECT_GT(test::max_abs_diff(out.logits, cls), 0.05);  // not the CLS head alone
}

TEST(DeitParity, InterpolatedPositionEmbeddingsMatchTransformers) {
  // 112x144 random pixels with interpolate_pos_encoding=True (bicubic 14x14 -> 7x9, the CLS and
  // distillation rows kept).
  test::expect_extra_expected_match("deit_tiny", {2, 3, 112, 144}, "deit_tiny 112x144");
}

TEST(DeitParity, ProcessorMatchesTransformersAndFeedsTheModel) {
  // DeiTImageProcessor (torchvision backend): bicubic resize to `size`, center crop to
  // `crop_size`, normalize with the ImageNet mean/std of preprocessor_config.json.
  c10::InferenceMode inference_mode;
  for (const auto& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const auto dir = test::model_fixture(f.name);
    const auto proc = image::load_image_processor(dir);
    const auto& c = proc->config();
    EXPECT_EQ(c.resample, 3);
    EXPECT_TRUE(c.do_center_crop);
    EXPECT_EQ(c.crop_height, f.crop);
    EXPECT_EQ(c.crop_width, f.crop);
    EXPECT_FLOAT_EQ(c.image_mean[0], 0.485f);
    EXPECT_FLOAT_EQ(c.image_std[2], 0.225f);
    EXPECT_EQ(proc->output_size(480, 640), std::make_pair(f.crop, f.crop));
    std::vector<at::Tensor> images;
    const auto meta = test::read_json(dir + "/meta.json");
    for (const auto& n : meta.at("images"))
      images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                                n.get<std::string>()));
    const auto out = proc->preprocess(images);
    const auto ref = test::expected_tensor(dir, "pixel_u8");
    ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
    const auto d = (out.pixel_u8.to(at::kInt) - ref.to(at::kInt)).abs();
    const double equal = d.eq(0).sum().item<double>() / static_cast<double>(d.numel());
    const int max_diff = d.max().item<int>();
    std::cout << "[" << f.name << "] pixel_u8 " << 100.0 * equal << " % equal, max |diff| "
              << max_diff << "\n";
    EXPECT_GE(equal, 0.99);
    EXPECT_LE(max_diff, 1);
    EXPECT_TRUE(at::equal(out.pixel_values, proc->rescale_normalize(out.pixel_u8)));
    // JPEG -> logits end to end.
    const auto logits = models::load_model(dir)->forward(out.pixel_values).logits;
    const double dl = test::max_abs_diff(logits, test::expected_tensor(dir, "logits"));
    std::cout << "[" << f.name << "] our pixels: max|logits - logits| = " << dl << "\n";
    EXPECT_LE(dl, max_diff == 0 ? 1e-4 : 0.05);
  }
}

TEST(DeitParity, SetFusedAttentionCountsChangedModules) {
  // deit_tiny_distilled: three encoder layers, one attention module each.
  test::expect_fused_attention_toggles("deit_tiny_distilled", fused_default(), 3);
}

TEST(DeitParity, RejectsBadInput) { test::expect_classifier_rejects_bad_input("deit_tiny"); }

/// A copy of a fixture folder whose model.safetensors (float32 tensors) is rewritten by `edit`
/// and whose config.json by `edit_config`; removed with the object.
class EditedCheckpoint {
 public:
  EditedCheckpoint(const std::string& fixture,
                   const std::function<void(std::map<std::string, at::Tensor>&)>& edit,
                   const std::function<void(nlohmann::json&)>& edit_config = {}) {
    char tmpl[] = "/tmp/deit_parity_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    const auto src = test::model_fixture(fixture);
    auto config = test::read_json(src + "/config.json");
    if (edit_config) edit_config(config);
    std::ofstream(dir_ + "/config.json") << config.dump(1);
    std::ifstream pre(src + "/preprocessor_config.json");
    std::ofstream(dir_ + "/preprocessor_config.json") << pre.rdbuf();
    const auto file = models::core::SafetensorsFile::open(src + "/model.safetensors");
    std::map<std::string, at::Tensor> tensors;
    for (const auto& t : file->header().tensors) tensors[t.key] = file->view(t.key).clone();
    edit(tensors);
    test::NamedTensors out;  // float32 throughout, as the fixture stores them
    for (const auto& [key, t] : tensors) out.emplace_back(key, t.to(at::kFloat));
    test::write_safetensors(dir_ + "/model.safetensors", out);
  }
  // Not std::filesystem::remove_all: the PyPI wheel's libtorch.so exports one that crashes when
  // it wins symbol resolution (tests/unit/models_core_test.cpp TempDir).
  ~EditedCheckpoint() {
    for (const char* f : {"/config.json", "/preprocessor_config.json", "/model.safetensors"})
      ::unlink((dir_ + f).c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& dir() const { return dir_; }

  /// The load error's message ("" when it loads).
  std::string load_error() const {
    try {
      models::load_model(dir_);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::string dir_;
};

TEST(DeitParity, LoadErrorsNameTheUnknownAndTheMissingKey) {
  {
    // DeiTForMaskedImageModeling's mask token is no parameter of the classifiers.
    EditedCheckpoint ck("deit_tiny", [](auto& t) {
      t["deit.embeddings.mask_token"] = at::zeros({1, 1, 32});
    });
    EXPECT_EQ(ck.load_error(), ck.dir() +
                                   "/model.safetensors: checkpoint does not match the model: "
                                   "unexpected keys (1): deit.embeddings.mask_token");
  }
  {
    EditedCheckpoint ck("deit_tiny",
                        [](auto& t) { t.erase("deit.embeddings.distillation_token"); });
    EXPECT_EQ(ck.load_error(), ck.dir() +
                                   "/model.safetensors: checkpoint does not match the model: "
                                   "missing keys (1): deit.embeddings.distillation_token");
  }
  {
    // A WithTeacher checkpoint under a DeiTForImageClassification config: both heads named.
    EditedCheckpoint ck(
        "deit_tiny_distilled", [](auto&) {},
        [](nlohmann::json& c) { c["architectures"] = {"DeiTForImageClassification"}; });
    EXPECT_EQ(ck.load_error(),
              ck.dir() +
                  "/model.safetensors: checkpoint does not match the model: missing keys (2): "
                  "classifier.weight, classifier.bias; unexpected keys (4): cls_classifier.bias, "
                  "cls_classifier.weight, distillation_classifier.bias, "
                  "distillation_classifier.weight");
  }
  {
    // A base-model pooler is ignored, as for ViT.
    EditedCheckpoint ck("deit_tiny", [](auto& t) {
      t["deit.pooler.dense.weight"] = at::zeros({32, 32});
      t["deit.pooler.dense.bias"] = at::zeros({32});
    });
    EXPECT_EQ(ck.load_error(), "");
  }
  {
    EditedCheckpoint ck(
        "deit_tiny", [](auto&) {},
        [](nlohmann::json& c) { c["architectures"] = {"DeiTForMaskedImageModeling"}; });
    EXPECT_NE(ck.load_error().find("architectures"), std::string::npos) << ck.load_error();
    EXPECT_NE(ck.load_error().find("DeiTForImageClassificationWithTeacher"), std::string::npos);
  }
}

}  // namespace
}  // namespace libreyolo
