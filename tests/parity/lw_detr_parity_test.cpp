// LW-DETR (transformers 5.17 LwDetrForObjectDetection: ViT backbone with window and global
// blocks, C2F projector at scales 2.0 / 1.0 / 0.5, two-stage queries, deformable decoder)
// against the lw_detr_tiny fixture (tests/fixtures/models/lw_detr_tiny/make_fixtures.py): a
// batch of two photographs at 192x256 (the position embeddings are bicubic-resized from the
// 8x8 pretraining grid). The processor and post-processing are checked on every fixture by
// postprocess_parity_test.cpp; here the model, its loading errors and its input checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include "models/core/safetensors.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/lw_detr/decoder.h"
#include "models/lw_detr/lw_detr.h"
#include "models/lw_detr/two_stage.h"
#include "models/model.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

constexpr const char* kFixture = "lw_detr_tiny";

TEST(LwDetrParity, LogitsAndBoxesMatchTransformers) {
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  auto model = models::load_model(dir);
  ASSERT_EQ(model->model_type(), "lw_detr");
  EXPECT_EQ(model->task(), models::Task::object_detection);
  EXPECT_EQ(model->id2label().size(), 6u);
  EXPECT_EQ(model->description().head, image::DetectionHead::deformable_detr);
  const auto pixels = test::normalized_pixels(dir);
  const auto mask = test::expected_tensor(dir, "pixel_mask");
  const auto logits_ref = test::expected_tensor(dir, "logits");
  const auto boxes_ref = test::expected_tensor(dir, "pred_boxes");
  for (bool fused : {false, true}) {
    model->set_fused_attention(fused);
    for (bool with_mask : {true, false}) {
      const auto out = with_mask ? model->forward(pixels, mask) : model->forward(pixels);
      ASSERT_EQ(out.logits.sizes(), logits_ref.sizes());
      ASSERT_EQ(out.pred_boxes.sizes(), boxes_ref.sizes());
      const double dl = test::max_abs_diff(out.logits, logits_ref);
      const double db = test::max_abs_diff(out.pred_boxes, boxes_ref);
      std::cout << "[" << kFixture << "] " << (fused ? "sdpa  " : "manual")
                << (with_mask ? " pixel_mask" : " no mask   ")
                << " attention: max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
                << "\n";
      EXPECT_LE(dl, 1e-4);
      EXPECT_LE(db, 1e-5);
    }
  }
}

TEST(LwDetrParity, PostProcessingMatchesTransformers) {
  // Our post-processing of our own outputs equals transformers' of its outputs: labels and
  // their order exactly, scores and boxes (original pixels) within float noise.
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  auto model = models::load_model(dir);
  const auto out = model->forward(test::normalized_pixels(dir));
  const auto meta = test::read_json(dir + "/meta.json");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  int checked = 0;
  for (const char* th : {"0.0", "0.3"}) {
    image::PostProcessOptions opt;
    opt.threshold = std::stod(th);
    const auto dets = image::post_process_object_detection(out.logits, out.pred_boxes, sizes,
                                                           model->description().head, opt);
    ASSERT_EQ(dets.size(), 2u);
    for (size_t i = 0; i < dets.size(); ++i) {
      const std::string key = std::string("th") + th + "_img" + std::to_string(i);
      SCOPED_TRACE(key);
      const auto s = test::expected_tensor(dir, key + "_scores");
      ASSERT_EQ(dets[i].scores.numel(), s.numel());
      EXPECT_GT(s.numel(), 0);
      EXPECT_TRUE(at::equal(dets[i].labels, test::expected_tensor(dir, key + "_labels")));
      EXPECT_LE(test::max_abs_diff(dets[i].scores, s), 1e-5);
      EXPECT_LE(test::max_abs_diff(dets[i].boxes, test::expected_tensor(dir, key + "_boxes")),
                1e-2);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
}

TEST(LwDetrParity, ProcessorMatchesPixelU8) {
  // DeformableDetrImageProcessor at an exact {height, width}: resize within 1 of torchvision's
  // uint8 kernel, pixel_mask all ones.
  const auto dir = test::model_fixture(kFixture);
  const image::ImageProcessor proc(
      image::ProcessorConfig::from_file(dir + "/preprocessor_config.json"));
  std::vector<at::Tensor> images;
  const auto meta = test::read_json(dir + "/meta.json");
  for (const auto& name : meta.at("images"))
    images.push_back(image::decode_image_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                              name.get<std::string>()));
  const auto out = proc.preprocess(images);
  const auto ref = test::expected_tensor(dir, "pixel_u8");
  ASSERT_EQ(out.pixel_u8.sizes(), ref.sizes());
  const auto d = (out.pixel_u8.to(at::kInt) - ref.to(at::kInt)).abs();
  const double equal = d.eq(0).sum().item<double>() / static_cast<double>(d.numel());
  std::cout << "[" << kFixture << "] pixel_u8 " << 100.0 * equal << " % equal, max |diff| "
            << d.max().item<int>() << "\n";
  EXPECT_GE(equal, 0.99);
  EXPECT_LE(d.max().item<int>(), 1);
  ASSERT_TRUE(out.pixel_mask.defined());
  EXPECT_TRUE(at::equal(out.pixel_mask, test::expected_tensor(dir, "pixel_mask")));
}

TEST(LwDetr, RejectsBadInput) {
  auto model = models::load_model(test::model_fixture(kFixture));
  const auto x = at::zeros({1, 3, 64, 64});
  EXPECT_THROW(model->forward(at::zeros({1, 4, 64, 64})), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 32, 64}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(x, at::ones({1, 64, 64}, at::kFloat)), std::invalid_argument);
  // 48 px = 3 patches: not divisible into 2x2 windows.
  try {
    model->forward(at::zeros({1, 3, 48, 64}));
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("windows"), std::string::npos) << e.what();
  }
  // 32x32 = 2x2 patches: 4 + 16 + 1 = 21 projector tokens >= 12 queries, accepted.
  EXPECT_NO_THROW(model->forward(at::zeros({1, 3, 32, 32})));
}

TEST(LwDetr, HalfPrecisionLoadsAndRuns) {
  // LoadOptions dtype float16 / bfloat16 on CPU: float32, finite outputs, the same for float32
  // and half inputs (the one input rule). Not compared with the float32 model: on this random
  // fixture half precision moves the two-stage top-k, so transformers' own float16 / bfloat16
  // logits are 0.35 / 1.18 away from its float32 ones. Against transformers (eager attention)
  // in the same dtype, libreyolo-predict --dtype float16 / bfloat16 measured 0 difference
  // (2026-12-01, image 1 of the fixture).
  c10::InferenceMode inference_mode;
  const auto dir = test::model_fixture(kFixture);
  const auto pixels = test::normalized_pixels(dir).slice(0, 1, 2).contiguous();
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    models::LoadOptions options;
    options.dtype = dtype;
    const auto model = models::load_model(dir, options);
    const auto out = model->forward(pixels);
    ASSERT_EQ(out.logits.scalar_type(), at::kFloat);
    ASSERT_EQ(out.pred_boxes.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::isfinite(out.logits).all().item<bool>()) << dtype;
    EXPECT_TRUE(at::isfinite(out.pred_boxes).all().item<bool>()) << dtype;
    EXPECT_TRUE(at::equal(out.logits, model->forward(pixels.to(dtype)).logits)) << dtype;
  }
}

TEST(LwDetrGeometry, RefineBoxesAndSineEmbedding) {
  const auto ref = at::tensor({0.5f, 0.5f, 0.2f, 0.4f}).view({1, 4});
  const auto delta = at::tensor({1.0f, -1.0f, 0.0f, std::log(2.0f)}).view({1, 4});
  const auto r = models::lw_detr::refine_boxes(ref, delta);
  EXPECT_TRUE(at::allclose(r, at::tensor({0.7f, 0.1f, 0.2f, 0.8f}).view({1, 4})));
  // (x, y) = (0.25, 0.5), 4 features each: y first, then x; [sin, cos, sin, cos].
  const auto e =
      models::lw_detr::sinusoidal_position_embedding(at::tensor({0.25f, 0.5f}).view({1, 2}), 4);
  ASSERT_EQ(e.sizes(), (at::IntArrayRef{1, 8}));
  const double y = 0.5 * 2 * M_PI, x = 0.25 * 2 * M_PI;
  EXPECT_NEAR(e[0][0].item<double>(), std::sin(y), 1e-6);
  EXPECT_NEAR(e[0][1].item<double>(), std::cos(y), 1e-6);
  EXPECT_NEAR(e[0][2].item<double>(), std::sin(y / 100), 1e-6);
  EXPECT_NEAR(e[0][4].item<double>(), std::sin(x), 1e-6);
}

// Copies config.json and writes model.safetensors from `src` with `edit` applied to the
// (key -> tensor) list (safetensors format). Returns the new folder.
std::string edited_checkpoint(
    const std::string& src,
    const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
  // POSIX, not std::filesystem: LibTorch's libtorch.so exports clashing std::filesystem symbols.
  char tmpl[] = "/tmp/libreyolo_lwdetr_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string tmp = tmpl;
  {
    std::ifstream in(src + "/config.json", std::ios::binary);
    std::ofstream out(tmp + "/config.json", std::ios::binary);
    out << in.rdbuf();
  }
  const auto file = models::core::SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& key : file->keys()) tensors.emplace_back(key, file->view(key).clone());
  edit(tensors);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [key, t] : tensors) {
    const size_t bytes = t.numel() * t.element_size();
    // The fixture holds float32 tensors and int64 num_batches_tracked.
    header[key] = {{"dtype", t.scalar_type() == at::kLong ? "I64" : "F32"},
                   {"shape", t.sizes().vec()},
                   {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(t.data_ptr()), bytes);
  }
  const std::string h = header.dump();
  std::ofstream out(tmp + "/model.safetensors", std::ios::binary);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << h << data;
  return tmp;
}

void remove_checkpoint(const std::string& dir) {
  std::remove((dir + "/config.json").c_str());
  std::remove((dir + "/model.safetensors").c_str());
  rmdir(dir.c_str());
}

std::string load_error(const std::string& dir) {
  try {
    models::load_model(dir);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(LwDetrLoading, UnknownAndMissingKeysAreNamed) {
  const auto src = test::model_fixture(kFixture);
  const std::string missing_key = "model.enc_out_class_embed.2.bias";  // an unused group's head
  auto dir = edited_checkpoint(src, [&](auto& t) {
    t.erase(
        std::remove_if(t.begin(), t.end(), [&](const auto& e) { return e.first == missing_key; }),
        t.end());
  });
  EXPECT_EQ(load_error(dir), dir +
                                 "/model.safetensors: checkpoint does not match the model: "
                                 "missing keys (1): " +
                                 missing_key);
  remove_checkpoint(dir);
  dir = edited_checkpoint(src, [](auto& t) {
    t.emplace_back("model.backbone.backbone.encoder.layer.0.attention.attention.key.bias",
                   at::zeros({32}));
  });
  EXPECT_EQ(load_error(dir),
            dir +
                "/model.safetensors: checkpoint does not match the model: unexpected keys (1): "
                "model.backbone.backbone.encoder.layer.0.attention.attention.key.bias");
  remove_checkpoint(dir);
}

TEST(LwDetrLoading, TransformersModuleNamesAreAccepted) {
  // The same weights under transformers 5's module names (attention.q_proj ... o_proj) load to
  // the same model.
  c10::InferenceMode inference_mode;
  const auto src = test::model_fixture(kFixture);
  const auto dir = edited_checkpoint(src, [](auto& t) {
    for (auto& [key, value] : t) {
      for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
               {".attention.attention.query.", ".attention.q_proj."},
               {".attention.attention.key.", ".attention.k_proj."},
               {".attention.attention.value.", ".attention.v_proj."},
               {".attention.output.", ".attention.o_proj."}}) {
        const auto at = key.find(from);
        if (at != std::string::npos) key = key.substr(0, at) + to + key.substr(at + from.size());
      }
    }
  });
  const auto x = test::normalized_pixels(src).slice(0, 0, 1);
  const auto a = models::load_model(src)->forward(x);
  const auto b = models::load_model(dir)->forward(x);
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  remove_checkpoint(dir);
}

TEST(LwDetrLoading, UnsupportedConfigsAreNamedErrors) {
  const auto src = test::model_fixture(kFixture);
  const auto base = test::read_json(src + "/config.json");
  char tmpl[] = "/tmp/libreyolo_lwdetr_cfg_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string tmp = tmpl;
  auto expect_error = [&](nlohmann::json config, const std::string& needle) {
    std::ofstream(tmp + "/config.json") << config.dump();
    const auto what = load_error(tmp);
    EXPECT_NE(what.find("config.json"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  };
  auto c = base;
  c["projector_scale_factors"] = {0.25};
  expect_error(c, "projector_scale_factors");
  c = base;
  c["backbone_config"]["model_type"] = "dinov2";
  expect_error(c, "backbone_config.model_type");
  c = base;
  c["backbone_config"]["num_windows"] = 8;
  expect_error(c, "backbone_config.num_windows");
  c = base;
  c["decoder_cross_attention_heads"] = 5;
  expect_error(c, "decoder_cross_attention_heads");
  std::remove((tmp + "/config.json").c_str());
  rmdir(tmp.c_str());
}

}  // namespace
}  // namespace libreyolo
