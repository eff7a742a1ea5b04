// The family registry (models/registry/family.h): every family folder of the tree registers
// exactly one record, the records are consistent, a taken model_type is refused with an exact
// message, and an unknown model_type fails as load_model always did.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/core/config.h"
#include "models/layouts/catalog.h"
#include "models/model.h"
#include "models/registry/family.h"

namespace libreyolo::models {
namespace {

namespace fs = std::filesystem;

/// Registrations per folder of models/: the files that construct a FamilyRegistrar.
std::map<std::string, int> registrations_in_tree() {
  std::map<std::string, int> out;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(LIBREYOLO_SOURCE_DIR) / "models")) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (size_t at = s.find("const FamilyRegistrar "); at != std::string::npos;
         at = s.find("const FamilyRegistrar ", at + 1))
      out[entry.path().parent_path().filename().string()] += 1;
  }
  return out;
}

Family fake(const std::string& name, std::vector<std::string> model_types) {
  Family f;
  f.name = name;
  f.model_types = std::move(model_types);
  f.load = [](const std::string&, const nlohmann::json&,
              const LoadOptions&) -> std::unique_ptr<Model> { return nullptr; };
  return f;
}

std::string message_of_add(FamilyRegistry& r, Family f) {
  try {
    r.add(std::move(f));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(FamilyRegistry, EveryFamilyFolderRegistersExactlyOnce) {
  const auto in_tree = registrations_in_tree();
  ASSERT_FALSE(in_tree.empty());
  std::vector<std::string> folders, registered;
  for (const auto& [folder, count] : in_tree) {
    EXPECT_EQ(count, 1) << "models/" << folder << " registers " << count << " families";
    folders.push_back(folder);
  }
  for (const Family* f : FamilyRegistry::builtin().all()) registered.push_back(f->name);
  std::sort(registered.begin(), registered.end());
  EXPECT_EQ(registered, folders);  // a record's name is its folder
  EXPECT_EQ(folders, (std::vector<std::string>{
                         "conditional_detr", "dab_detr", "deformable_detr", "deimv2", "deit",
                         "detr", "dfine", "grounding_dino", "lw_detr", "omdet_turbo", "owlvit",
                         "pp_doclayout_v2", "pp_doclayout_v3", "rf_detr", "rtdetr", "swin",
                         "table_transformer", "vit", "yolos"}));
}

TEST(FamilyRegistry, ModelTypesAndRecords) {
  const auto& registry = FamilyRegistry::builtin();
  const std::map<std::string, std::string> family_of{{"rt_detr", "rtdetr"},
                                                     {"rt_detr_v2", "rtdetr"},
                                                     {"deformable_detr", "deformable_detr"},
                                                     {"d_fine", "dfine"},
                                                     {"deimv2", "deimv2"},
                                                     {"lw_detr", "lw_detr"},
                                                     {"rf_detr", "rf_detr"},
                                                     {"vit", "vit"},
                                                     {"deit", "deit"},
                                                     {"swin", "swin"},
                                                     {"detr", "detr"},
                                                     {"conditional_detr", "conditional_detr"},
                                                     {"dab-detr", "dab_detr"},
                                                     {"table-transformer", "table_transformer"},
                                                     {"yolos", "yolos"},
                                                     {"owlvit", "owlvit"},
                                                     {"owlv2", "owlvit"},
                                                     {"grounding-dino", "grounding_dino"},
                                                     {"mm-grounding-dino", "grounding_dino"},
                                                     {"omdet-turbo", "omdet_turbo"},
                                                     {"pp_doclayout_v2", "pp_doclayout_v2"},
                                                     {"pp_doclayout_v3", "pp_doclayout_v3"}};
  size_t types = 0;
  for (const Family* f : registry.all()) {
    types += f->model_types.size();
    ASSERT_NE(f->load, nullptr) << f->name;
    ASSERT_FALSE(f->tasks.empty()) << f->name;
    const bool classifier = f->tasks == std::vector<Task>{Task::image_classification};
    // A detector's record names its post-processing; a classifier's has none.
    EXPECT_EQ(f->head.has_value(), !classifier) << f->name;
    EXPECT_FALSE(f->fused_attention_default) << f->name;  // manual everywhere, measured
    for (const auto& layout : f->default_layouts)
      EXPECT_NE(layouts::find_layout_info(layout), nullptr) << f->name << ": " << layout;
    for (const auto& rule : f->layout_classes) {
      const auto* info = layouts::find_layout_info(rule.layout);
      ASSERT_NE(info, nullptr) << f->name << ": " << rule.layout;
      for (const auto& c : rule.classes)
        EXPECT_NE(std::find(info->replaces.begin(), info->replaces.end(), c), info->replaces.end())
            << c;
    }
  }
  EXPECT_EQ(types, family_of.size());
  for (const auto& [type, family] : family_of) {
    const Family* f = registry.find(type);
    ASSERT_NE(f, nullptr) << type;
    EXPECT_EQ(f->name, family) << type;
  }
  EXPECT_EQ(*registry.find("d_fine")->head, image::DetectionHead::rt_detr);
  EXPECT_EQ(*registry.find("lw_detr")->head, image::DetectionHead::deformable_detr);
  EXPECT_EQ(*registry.find("detr")->head, image::DetectionHead::detr);
  EXPECT_EQ(*registry.find("conditional_detr")->head, image::DetectionHead::deformable_detr);
  EXPECT_EQ(*registry.find("dab-detr")->head, image::DetectionHead::deformable_detr);
  EXPECT_EQ(*registry.find("table-transformer")->head, image::DetectionHead::detr);
  EXPECT_EQ(*registry.find("yolos")->head, image::DetectionHead::detr);
  EXPECT_EQ(*registry.find("pp_doclayout_v3")->head, image::DetectionHead::pp_doclayout);
  EXPECT_EQ(*registry.find("pp_doclayout_v2")->head, image::DetectionHead::pp_doclayout_v2);
  EXPECT_EQ(*registry.find("owlv2")->head, image::DetectionHead::prompted);
  EXPECT_EQ(*registry.find("omdet-turbo")->head, image::DetectionHead::prompted);
  EXPECT_EQ(registry.find("yolo_nas"), nullptr);
  // The families whose forward reads pixel_mask (the server batches their requests of any size
  // together); YOLOS, the RT-DETR lineage, PP-DocLayoutV3 and the classifiers take none.
  std::vector<std::string> masked;
  for (const Family* f : registry.all())
    if (f->pixel_mask) masked.push_back(f->name);
  EXPECT_EQ(masked,
            (std::vector<std::string>{"detr", "conditional_detr", "dab_detr", "table_transformer",
                                      "deformable_detr", "lw_detr", "rf_detr"}));
  // The order of all(): Family::order, then name.
  std::vector<std::string> order;
  for (const Family* f : registry.all()) order.push_back(f->name);
  EXPECT_EQ(order, (std::vector<std::string>{
                       "rtdetr", "detr", "conditional_detr", "dab_detr", "table_transformer",
                       "deformable_detr", "grounding_dino", "omdet_turbo", "dfine",
                       "pp_doclayout_v2", "pp_doclayout_v3", "deimv2", "lw_detr", "rf_detr",
                       "yolos", "owlvit", "vit", "deit", "swin"}));
}

TEST(FamilyRegistry, TakenModelTypeAndIncompleteRecordsAreRefused) {
  FamilyRegistry r;
  r.add(fake("alpha", {"a", "b"}));
  EXPECT_EQ(message_of_add(r, fake("beta", {"c", "b"})),
            "model_type \"b\" is registered twice (families alpha and beta)");
  EXPECT_EQ(message_of_add(r, fake("gamma", {"g", "g"})),
            "model_type \"g\" is registered twice (families gamma and gamma)");
  EXPECT_EQ(message_of_add(r, fake("", {"x"})), "family \"\": no name");
  EXPECT_EQ(message_of_add(r, fake("delta", {})), "family \"delta\": no model_type");
  Family no_loader = fake("epsilon", {"e"});
  no_loader.load = nullptr;
  EXPECT_EQ(message_of_add(r, no_loader), "family \"epsilon\": no loader");
  // Refused records leave the registry as it was.
  ASSERT_EQ(r.all().size(), 1u);
  EXPECT_EQ(r.find("c"), nullptr);
  EXPECT_EQ(r.find("a")->name, "alpha");
}

TEST(FamilyRegistry, UnknownModelTypeIsTheConfigErrorOfLoadModel) {
  const nlohmann::json config{{"model_type", "yolo_nas"}};
  const core::ConfigView view(config, "/m/config.json");
  try {
    FamilyRegistry::builtin().require("yolo_nas", view);
    ADD_FAILURE();
  } catch (const core::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "/m/config.json: field 'model_type': unsupported model type \"yolo_nas\"");
  }
  EXPECT_EQ(FamilyRegistry::builtin().require("rt_detr_v2", view).name, "rtdetr");
}

TEST(FamilyRegistry, LayoutCatalogListsTheRecordsClasses) {
  // The order of a layout's classes follows FamilyRegistry::all(); serving.yaml errors quote it.
  EXPECT_EQ(layouts::find_layout_info("repvgg")->replaces,
            (std::vector<std::string>{"RTDetrRepVggBlock", "RTDetrV2RepVggBlock",
                                      "DFineRepVggBlock", "PPDocLayoutV2RepVggBlock",
                                      "PPDocLayoutV3RepVggBlock", "Deimv2RepVggBlock"}));
  EXPECT_EQ(layouts::find_layout_info("avgpool_fold")->replaces,
            std::vector<std::string>{"AvgPool2d"});
  EXPECT_EQ(layouts::find_layout_info("channels_last")->replaces,
            std::vector<std::string>{"Conv2d"});
  EXPECT_EQ(layouts::find_layout_info("batchnorm_fold")->replaces.size(),
            17u);  // + PP-DocLayoutV3's 2, PP-DocLayoutV2's PPDocLayoutV2ConvNormLayer, timm's
                   // ResNet, Bottleneck and BasicBlock (DETR's backbone)
  // + DETR's, PP-DocLayoutV3's, Conditional DETR's (its encoder's ConditionalDetrSelfAttention),
  // DAB-DETR's (its encoder's DetrAttention), Table Transformer's (TableTransformerAttention)
  // + YOLOS's 2, PP-DocLayoutV2's 2 (PPDocLayoutV2ReadingOrderSelfAttention,
  // PPDocLayoutV2SelfAttention)
  EXPECT_EQ(layouts::find_layout_info("qkv_concat")->replaces.size(), 25u);
  EXPECT_EQ(layouts::upstream_classes("table-transformer", layouts::ModuleKind::attention,
                                      "model.encoder.layers.0.self_attn"),
            std::vector<std::string>{"TableTransformerAttention"});
  EXPECT_TRUE(layouts::upstream_classes("table-transformer", layouts::ModuleKind::attention,
                                        "model.decoder.layers.0.encoder_attn")
                  .empty());
  // DETR: its self-attentions (q and k share their input), never the cross-attention.
  EXPECT_EQ(layouts::upstream_classes("detr", layouts::ModuleKind::attention,
                                      "model.decoder.layers.1.self_attn"),
            std::vector<std::string>{"DetrSelfAttention"});
  EXPECT_TRUE(layouts::upstream_classes("detr", layouts::ModuleKind::attention,
                                        "model.decoder.layers.1.encoder_attn")
                  .empty());
  EXPECT_TRUE(layouts::on_by_default("qkv_concat", "detr", false));
  EXPECT_TRUE(layouts::on_by_default("batchnorm_fold", "detr", false));
  // channels_last: measured on the H200 (DETR-R50 bf16 batch 8, docs/BENCHMARKS.md); off for
  // float32 without TF32 (cuDNN's FMA kernels).
  EXPECT_TRUE(layouts::on_by_default("channels_last", "detr", false));
  EXPECT_FALSE(layouts::on_by_default("channels_last", "detr", true));
  // PP-DocLayout: every layout in bfloat16 / float16 only.
  for (const char* type : {"pp_doclayout_v2", "pp_doclayout_v3"}) {
    EXPECT_FALSE(layouts::on_by_default("batchnorm_fold", type, false, false)) << type;
    EXPECT_TRUE(layouts::on_by_default("batchnorm_fold", type, false, true)) << type;
    EXPECT_TRUE(layouts::on_by_default("repvgg", type, false, true)) << type;
    EXPECT_FALSE(layouts::on_by_default("channels_last", type, true, true)) << type;
  }
  // timm's ResNet: the stem and the blocks by path; transformers' ResNet is not taken for them.
  EXPECT_EQ(layouts::upstream_classes("detr", layouts::ModuleKind::conv_norm,
                                      "model.backbone.conv_encoder.model"),
            std::vector<std::string>{"ResNet"});
  EXPECT_EQ(layouts::upstream_classes("detr", layouts::ModuleKind::conv_norm,
                                      "model.backbone.conv_encoder.model.layer3.1"),
            (std::vector<std::string>{"Bottleneck", "BasicBlock"}));
  EXPECT_EQ(layouts::upstream_classes(
                "detr", layouts::ModuleKind::conv_norm,
                "model.backbone.conv_encoder.model.encoder.stages.0.layers.0.layer.0"),
            std::vector<std::string>{"ResNetConvLayer"});
  // No family: no class, except the layouts' own torch.nn ones.
  EXPECT_TRUE(layouts::upstream_classes("yolo_nas", layouts::ModuleKind::attention, "x").empty());
  EXPECT_EQ(layouts::upstream_classes("yolo_nas", layouts::ModuleKind::conv2d, "x"),
            std::vector<std::string>{"Conv2d"});
  EXPECT_FALSE(layouts::on_by_default("qkv_concat", "yolo_nas", false));
}

}  // namespace
}  // namespace libreyolo::models
