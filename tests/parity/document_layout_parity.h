// Checks shared by the document-layout parity tests (pp_doclayout_v2_tiny, pp_doclayout_v3_tiny:
// each made by its make_fixtures.py from tests/fixtures/images/document_page.png and coffee.jpg
// through the family's image processor, 128x128, rescale only): the processor's pixels, the
// post-processed layouts at the fixture's thresholds, and the layouts gate's model options.
#pragma once

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "models/core/config.h"
#include "models/core/safetensors.h"
#include "models/image/decode.h"
#include "models/image/document_layout.h"
#include "models/image/processor.h"
#include "models/layouts/layouts.h"
#include "models/model.h"

namespace libreyolo::test::document_layout {

/// pixel_values = float32(pixel_u8) / 255 (rescale 1/255 fused with mean 0, std 1), bit for bit.
inline at::Tensor pixel_values(const models::core::SafetensorsFile& expected) {
  return expected.view("pixel_u8").to(at::kFloat) / 255.0f;
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

/// The family's processor (`dir`/preprocessor_config.json: bicubic without antialias) on the
/// page PNG and the photograph JPEG gives the fixture's pixel_u8 and pixel_values exactly.
inline void expect_processor_pixels_match(const std::string& dir) {
  const auto processor = image::load_image_processor(dir);
  EXPECT_FALSE(processor->config().antialias);
  std::vector<at::Tensor> images;
  for (const char* name : {"document_page.png", "coffee.jpg"}) {
    std::ifstream f(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" + name, std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f),
                                     std::istreambuf_iterator<char>()};
    images.push_back(image::decode_image(bytes.data(), bytes.size()));
  }
  const auto out = processor->preprocess(images);
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  EXPECT_TRUE(at::equal(out.pixel_u8, expected->view("pixel_u8")));
  EXPECT_TRUE(at::equal(out.pixel_values, pixel_values(*expected)));
  EXPECT_EQ(out.original_sizes, (std::vector<std::pair<int64_t, int64_t>>{{240, 180}, {400, 600}}));
}

/// image::post_process_document_layout of `out` (the model's outputs on the fixture's pixels;
/// its pred_masks, when defined, post-processed too) at each threshold of `dir`/meta.json
/// "postprocess" equals upstream's post_process_object_detection: counts, reading order and
/// labels exactly, scores within 1e-5, boxes within 6e-3 px (1e-5 of the 600 px width); masks,
/// when the model has them, one per detection at the mask resolution. Expects two thresholds.
inline void expect_post_processed_layouts_match(const std::string& dir,
                                                const models::ModelOutput& out) {
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto meta = models::core::read_json_file(dir + "/meta.json");
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& hw : meta.at("target_sizes_hw")) sizes.emplace_back(hw[0], hw[1]);
  int thresholds = 0;
  for (const auto& [key0, entry] : meta.at("postprocess").items()) {
    if (key0.size() < 5 || key0.substr(key0.size() - 5) != "_img0") continue;
    ++thresholds;
    const double th = entry.at("threshold").get<double>();
    const auto pages = image::post_process_document_layout(
        out.logits, out.pred_boxes, out.order_logits, out.pred_masks, sizes, th);
    ASSERT_EQ(pages.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const std::string key = key0.substr(0, key0.size() - 1) + std::to_string(i);
      const auto& p = pages[i];
      ASSERT_EQ(p.detections.scores.numel(), meta["postprocess"][key]["count"].get<int64_t>())
          << key;
      EXPECT_TRUE(at::equal(p.order, expected->view(key + "_order_seq"))) << key;
      EXPECT_TRUE(at::equal(p.detections.labels, expected->view(key + "_labels"))) << key;
      EXPECT_LE(max_abs_diff(p.detections.scores, expected->view(key + "_scores")), 1e-5) << key;
      EXPECT_LE(max_abs_diff(p.detections.boxes, expected->view(key + "_boxes")), 6e-3) << key;
      EXPECT_EQ(p.masks.defined(), out.pred_masks.defined()) << key;
      if (!out.pred_masks.defined()) continue;
      ASSERT_EQ(p.masks.size(0), p.detections.scores.size(0));
      EXPECT_EQ(p.masks.sizes().slice(1), out.pred_masks.sizes().slice(2));
    }
  }
  EXPECT_EQ(thresholds, 2);
  EXPECT_EQ(meta["postprocess"].size(), 4u);
}

/// `out` (the model's outputs on the fixture's pixels) against `dir`'s expected.safetensors:
/// logits <= 1e-4, pred_boxes <= 1e-5, order_logits <= 1e-4 (the keys + `reference`: "" for
/// transformers' default attention, "_eager" for attn_implementation="eager" where the fixture
/// has it), masks (when the model has them, "out_masks") <= 2e-4, and the reading order
/// (_get_order_seqs) equal; prints the maxima after `label`. Returns max|logits diff|.
/// `order_bound` replaces the order logits' 1e-4 (see expect_layouts_gate).
inline double expect_outputs_match(const std::string& dir, const models::ModelOutput& out,
                                   const std::string& label, const std::string& reference = "",
                                   double order_bound = 1e-4) {
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  EXPECT_EQ(out.logits.sizes(), expected->view("logits").sizes());
  EXPECT_EQ(out.order_logits.sizes(), expected->view("order_logits").sizes());
  const double dl = max_abs_diff(out.logits, expected->view("logits" + reference));
  const double db = max_abs_diff(out.pred_boxes, expected->view("pred_boxes" + reference));
  const double dord = max_abs_diff(out.order_logits, expected->view("order_logits" + reference));
  std::cout << label << " (vs transformers" << (reference.empty() ? "" : " " + reference.substr(1))
            << "): max|logits diff| = " << dl << ", max|pred_boxes diff| = " << db
            << ", max|order_logits diff| = " << dord;
  EXPECT_LE(dl, 1e-4) << label;
  EXPECT_LE(db, 1e-5) << label;
  EXPECT_LE(dord, order_bound) << label;
  EXPECT_TRUE(at::equal(image::reading_order(out.order_logits), expected->view("order_seq")))
      << label;
  if (out.pred_masks.defined()) {
    EXPECT_EQ(out.pred_masks.sizes(), expected->view("out_masks").sizes());
    const double dm = max_abs_diff(out.pred_masks, expected->view("out_masks"));
    std::cout << ", max|masks diff| = " << dm;
    EXPECT_LE(dm, 2e-4) << label;
  }
  std::cout << std::endl;
  return dl;
}

/// LoadOptions with every layout `mode` (on / off) as a command-line flag would set it.
inline models::LoadOptions with_layout_mode(kernels::LayoutMode mode) {
  models::LoadOptions o;
  o.layouts.mode.value = mode;
  o.layouts.mode.source = kernels::Source::flag;
  return o;
}

/// The layouts gate of tests/parity/layouts_parity_test.cpp for a document-layout fixture (its
/// own post-processing keys): with every layout off the outputs are byte-identical to the
/// default load's (no layout on by default), and with every layout on (`applied`, in order)
/// they stay within expect_outputs_match's bars (against `reference`; the order logits within
/// `order_bound`). One thread, inference mode.
inline void expect_layouts_gate(const std::string& dir, const std::vector<std::string>& applied,
                                const std::string& label, const std::string& reference = "",
                                double order_bound = 1e-4) {
  c10::InferenceMode guard;
  at::set_num_threads(1);
  const auto expected = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  const auto on = models::load_model(dir, with_layout_mode(kernels::LayoutMode::on));
  const auto off = models::load_model(dir, with_layout_mode(kernels::LayoutMode::off));
  EXPECT_TRUE(off->layouts().empty());
  std::vector<std::string> names;
  for (const auto& r : on->layouts()) names.push_back(r.layout);
  std::cout << label << " (on):\n" << models::layouts::describe(on->layouts());
  EXPECT_EQ(names, applied);
  const auto pixels = pixel_values(*expected);
  const auto b = off->forward(pixels), c = models::load_model(dir)->forward(pixels);
  EXPECT_TRUE(at::equal(b.logits, c.logits));
  EXPECT_TRUE(at::equal(b.order_logits, c.order_logits));
  expect_outputs_match(dir, on->forward(pixels), label + " on", reference, order_bound);
}

}  // namespace libreyolo::test::document_layout
