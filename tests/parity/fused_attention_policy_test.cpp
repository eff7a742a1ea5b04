// Fused-attention policy (DESIGN.md "Fused attention (SDPA): policy, not availability"):
// a family's attention modules default to at::scaled_dot_product_attention only where SDPA is
// byte-exact with the family's manual math. This test MEASURES max |SDPA - manual| on each
// family's fixture (stored pixels, CPU, float32), prints the table, and fails when the defaults
// in code disagree with the measurement (0 -> default SDPA, otherwise default manual).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "models/model.h"
#include "models/registry/family.h"
#include "tests/parity/fused_attention_fixtures.h"

namespace libreyolo {
namespace {

/// The registered family's Family::fused_attention_default for `model_type` (none when no
/// family registers it).
std::optional<bool> registered_default(const std::string& model_type) {
  const auto* family = models::FamilyRegistry::builtin().find(model_type);
  if (!family) return std::nullopt;
  return family->fused_attention_default;
}

struct Row {
  std::string fixture;
  std::optional<bool> constant;  ///< the registered family's default, where it has one
};

/// Model input of a fixture: stored pixel_values (RF-DETR), normalised (Deformable DETR, ViT,
/// DeiT, Swin) or rescaled (RT-DETR) pixel_u8.
std::pair<at::Tensor, at::Tensor> fixture_input(const std::string& dir) {
  const auto pre = test::read_json(dir + "/preprocessor_config.json");
  at::Tensor mask;
  const auto file = models::core::SafetensorsFile::open(dir + "/expected.safetensors");
  if (file->contains("pixel_mask")) mask = file->view("pixel_mask").clone().to(at::kLong);
  if (file->contains("pixel_values")) return {file->view("pixel_values").clone(), mask};
  if (pre.value("do_normalize", false)) return {test::normalized_pixels(dir), mask};
  const float rescale = pre.value("rescale_factor", 1.0f / 255.0f);
  return {test::expected_tensor(dir, "pixel_u8").to(at::kFloat) * rescale, mask};
}

/// Rows of the printed table, filled by each fixture's test.
std::vector<std::string>& table_rows() {
  static std::vector<std::string> rows;
  return rows;
}

class FusedAttentionPolicy : public ::testing::TestWithParam<Row> {
 public:
  static void TearDownTestSuite() {
    std::cout << "\nfixture                  max|SDPA-manual|  measured default  default in code\n";
    for (const auto& r : table_rows()) std::cout << r << "\n";
  }
};

TEST_P(FusedAttentionPolicy, DefaultFollowsMeasuredByteExactness) {
  const auto& row = GetParam();
  const auto dir = test::model_fixture(row.fixture);
  std::ostringstream line;
  line << std::left << std::setw(25) << row.fixture;
  if (access((dir + "/model.safetensors").c_str(), R_OK) != 0) {
    table_rows().push_back(line.str() + "(no fixture: skipped)");
    ASSERT_FALSE(row.constant.has_value()) << row.fixture << ": fixture missing";
    GTEST_SKIP() << "no fixture " << dir;
  }
  std::unique_ptr<models::Model> model;
  try {
    model = models::load_model(dir);
  } catch (const std::exception& e) {
    table_rows().push_back(line.str() + "(family not built: " + e.what() + ")");
    ASSERT_FALSE(row.constant.has_value()) << row.fixture << ": " << e.what();
    GTEST_SKIP() << e.what();
  }
  // Defaults in code: flipping everything to manual changes exactly the modules that default to
  // SDPA; flipping back to SDPA then changes all N of them.
  const int default_sdpa = model->set_fused_attention(false);
  const int total = model->set_fused_attention(true);
  ASSERT_GT(total, 0) << row.fixture << " has no attention module with a fused_attn flag";

  c10::InferenceMode inference_mode;
  const auto [x, mask] = fixture_input(dir);
  const auto fused = model->forward(x, mask);
  model->set_fused_attention(false);
  const auto manual = model->forward(x, mask);
  double diff = test::max_abs_diff(manual.logits, fused.logits);
  if (manual.pred_boxes.defined())
    diff = std::max(diff, test::max_abs_diff(manual.pred_boxes, fused.pred_boxes));
  const bool measured_sdpa = diff == 0.0;
  const bool code_sdpa = default_sdpa == total;
  const bool consistent = default_sdpa == 0 || default_sdpa == total;
  line << std::setw(18) << diff << std::setw(18) << (measured_sdpa ? "sdpa" : "manual")
       << (consistent ? (code_sdpa ? "sdpa" : "manual") : "mixed") << " ("
       << (code_sdpa == measured_sdpa && consistent ? "agrees" : "DISAGREES") << ", " << total
       << " modules)";
  table_rows().push_back(line.str());
  EXPECT_TRUE(consistent) << row.fixture << ": " << default_sdpa << " of " << total
                          << " modules default to SDPA";
  EXPECT_EQ(code_sdpa, measured_sdpa)
      << row.fixture << ": measured max|SDPA - manual| = " << diff << " -> default should be "
      << (measured_sdpa ? "SDPA" : "manual");
  if (row.constant) {
    EXPECT_EQ(*row.constant, measured_sdpa)
        << row.fixture << ": the family's fused_attention_default disagrees with the measurement";
  }
  // Flipping the flag never touches the weights: back on the manual path, bit-identical.
  model->set_fused_attention(true);
  model->set_fused_attention(false);
  EXPECT_TRUE(at::equal(model->forward(x, mask).logits, manual.logits)) << row.fixture;
}

INSTANTIATE_TEST_SUITE_P(
    Families, FusedAttentionPolicy,
    ::testing::Values(Row{"vit_tiny", registered_default("vit")},
                      Row{"yolos_tiny", registered_default("yolos")},
                      Row{"yolos_tiny_mid", registered_default("yolos")},
                      Row{"deit_tiny", registered_default("deit")},
                      Row{"deit_tiny_distilled", registered_default("deit")},
                      Row{"swin_tiny", registered_default("swin")},
                      Row{"deformable_detr_tiny", registered_default("deformable_detr")},
                      Row{"detr_tiny", registered_default("detr")},
                      Row{"detr_tiny_timm", registered_default("detr")},
                      Row{"conditional_detr_tiny", registered_default("conditional_detr")},
                      Row{"dab_detr_tiny", registered_default("dab-detr")},
                      Row{"table_transformer_tiny", registered_default("table-transformer")},
                      Row{"dfine_tiny", registered_default("d_fine")},
                      Row{"deimv2_tiny_dinov3", registered_default("deimv2")},
                      Row{"lw_detr_tiny", registered_default("lw_detr")},
                      Row{"rf_detr_tiny", registered_default("rf_detr")},
                      Row{"rtdetr_tiny", registered_default("rt_detr")}),
    [](const ::testing::TestParamInfo<Row>& info) { return info.param.fixture; });

}  // namespace
}  // namespace libreyolo
