// serving.yaml `kernel_config:` (models/layouts/kernel_config.h): the accepted forms and the exact
// configuration errors, and the layout catalog's class table.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "models/layouts/catalog.h"
#include "models/layouts/kernel_config.h"

namespace libreyolo::models::layouts {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_kernel_config_text(yaml, "s.yaml");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(KernelConfig, ClassNamesAndOff) {
  const auto e = parse_kernel_config_text(
      "RTDetrConvNormLayer: batchnorm_fold\nRTDetrResNetConvLayer: off\n", "s.yaml");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].key, "RTDetrConvNormLayer");
  ASSERT_EQ(e[0].targets.size(), 1u);
  EXPECT_EQ(e[0].targets[0].class_name, "RTDetrConvNormLayer");
  EXPECT_EQ(e[0].targets[0].path_pattern, "");
  EXPECT_EQ(e[0].value, "batchnorm_fold");
  EXPECT_EQ(e[0].origin, "s.yaml:1:1");
  EXPECT_FALSE(e[0].is_hub());
  EXPECT_EQ(e[1].value, "off");
  EXPECT_EQ(e[1].origin, "s.yaml:2:1");
}

TEST(KernelConfig, ClassPathPairsSharingOneParent) {
  const auto e = parse_kernel_config_text(
      "? [[RTDetrRepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.*],\n"
      "   [RTDetrV2RepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.1]]\n"
      ": repvgg\n",
      "s.yaml");
  ASSERT_EQ(e.size(), 1u);
  ASSERT_EQ(e[0].targets.size(), 2u);
  EXPECT_EQ(e[0].targets[1].class_name, "RTDetrV2RepVggBlock");
  EXPECT_EQ(e[0].targets[1].path_pattern, "model.encoder.fpn_blocks.0.bottlenecks.1");
  EXPECT_EQ(e[0].key,
            "[[RTDetrRepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.*], "
            "[RTDetrV2RepVggBlock, model.encoder.fpn_blocks.0.bottlenecks.1]]");
  EXPECT_EQ(e[0].value, "repvgg");
}

TEST(KernelConfig, HubReferenceWithOptions) {
  const auto e = parse_kernel_config_text(
      "ViTAttention: {layout: \"acme/fast-attn:FusedQKV\", revision: v1, trust_remote_code: true}",
      "s.yaml");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_TRUE(e[0].is_hub());
  EXPECT_EQ(e[0].value, "acme/fast-attn:FusedQKV");
  EXPECT_EQ(e[0].revision, "v1");
  EXPECT_EQ(e[0].version, "");
  EXPECT_TRUE(e[0].trust_remote_code);
}

TEST(KernelConfig, ExactErrors) {
  EXPECT_EQ(error_of("- a\n"),
            "s.yaml:1:1: kernel_config: must be a mapping of class names (or [class, path] "
            "pairs) to layouts");
  EXPECT_EQ(
      error_of("? [[RTDetrConvNormLayer, model.encoder.lateral_convs.*], "
               "[RTDetrConvNormLayer, model.encoder.downsample_convs.0]]\n: batchnorm_fold\n"),
      "s.yaml:1:58: kernel_config: key [[RTDetrConvNormLayer, "
      "model.encoder.lateral_convs.*], [RTDetrConvNormLayer, "
      "model.encoder.downsample_convs.0]]: path patterns 'model.encoder.lateral_convs.*' "
      "and 'model.encoder.downsample_convs.0' do not share one parent");
  EXPECT_EQ(
      error_of("RTDetrConvNormLayer: repvgg\n"),
      "s.yaml:1:22: kernel_config: RTDetrConvNormLayer: layout repvgg does not replace "
      "RTDetrConvNormLayer (it replaces RTDetrRepVggBlock, RTDetrV2RepVggBlock, "
      "DFineRepVggBlock, PPDocLayoutV2RepVggBlock, PPDocLayoutV3RepVggBlock, Deimv2RepVggBlock)");
  EXPECT_EQ(error_of("ViTAttention: fused\n"),
            "s.yaml:1:15: kernel_config: ViTAttention: unknown layout 'fused' (expected off, "
            "repvgg, batchnorm_fold, avgpool_fold, qkv_concat, channels_last, or "
            "owner/repo:ClassName)");
  EXPECT_EQ(error_of("ViTAttention: acme/fast-attn\n"),
            "s.yaml:1:15: kernel_config: ViTAttention: hub reference 'acme/fast-attn' must be "
            "owner/repo:ClassName");
  // Fuzzing finding (serving_yaml_fuzz): a 100,000-character value overflowed the stack in
  // std::regex.
  EXPECT_EQ(error_of("ViTAttention: o/" + std::string(100000, 'r') + ":C\n"),
            "s.yaml:1:15: kernel_config: ViTAttention: hub reference 'o/" + std::string(75, 'r') +
                "...' must be owner/repo:ClassName (100004 characters, at most 512)");
  EXPECT_EQ(error_of("ViTAttention: {layout: a/b:C, version: '1', revision: x}\n"),
            "s.yaml:1:15: kernel_config: ViTAttention: give version or revision, not both");
  EXPECT_EQ(error_of("ViTAttention: {layout: qkv_concat, revision: x}\n"),
            "s.yaml:1:15: kernel_config: ViTAttention: version, revision and trust_remote_code "
            "apply to hub references only");
  EXPECT_EQ(error_of("ViTAttention: {layout: a/b:C, pin: x}\n"),
            "s.yaml:1:31: kernel_config: ViTAttention: unknown option 'pin' (expected layout, "
            "version, revision, trust_remote_code)");
  EXPECT_EQ(error_of("? [RTDetrConvNormLayer]\n: off\n"),
            "s.yaml:1:4: kernel_config: a key must be a class name or a list of [class_name, "
            "path_pattern] pairs");
  const std::string unknown = error_of("LlamaRMSNorm: off\n");
  EXPECT_EQ(unknown.rfind("s.yaml:1:1: kernel_config: unknown class 'LlamaRMSNorm' (no layout "
                          "replaces it; known: RTDetrRepVggBlock, ",
                          0),
            0u)
      << unknown;
}

TEST(LayoutCatalog, UpstreamClassesPerFamilyAndPath) {
  using K = ModuleKind;
  EXPECT_EQ(upstream_classes("rt_detr", K::conv_norm, "model.backbone.model.embedder.embedder.0"),
            std::vector<std::string>{"RTDetrResNetConvLayer"});
  EXPECT_EQ(upstream_classes("rt_detr", K::conv_norm,
                             "model.backbone.model.encoder.stages.1.layers.0.shortcut.1"),
            std::vector<std::string>{"RTDetrResNetShortCut"});
  EXPECT_EQ(upstream_classes("rt_detr_v2", K::conv_norm, "model.encoder.lateral_convs.0"),
            std::vector<std::string>{"RTDetrV2ConvNormLayer"});
  EXPECT_EQ(upstream_classes("d_fine", K::conv_norm, "model.backbone.model.embedder.stem1"),
            std::vector<std::string>{"HGNetV2ConvLayer"});
  EXPECT_EQ(upstream_classes("d_fine", K::repvgg_block, "x"),
            std::vector<std::string>{"DFineRepVggBlock"});
  EXPECT_EQ(upstream_classes("deformable_detr", K::conv_norm, "model.backbone.a.shortcut"),
            std::vector<std::string>{"ResNetShortCut"});
  EXPECT_EQ(upstream_classes("vit", K::attention, "vit.encoder.layer.0.attention.attention"),
            (std::vector<std::string>{"ViTAttention", "ViTSelfAttention"}));
  EXPECT_TRUE(upstream_classes("vit", K::repvgg_block, "x").empty());
  EXPECT_EQ(upstream_classes("rt_detr", K::conv_norm, "model.encoder_input_proj.2"),
            std::vector<std::string>{"Sequential"});
  EXPECT_EQ(upstream_classes("d_fine", K::conv_norm, "model.decoder_input_proj.0"),
            std::vector<std::string>{"Sequential"});
  EXPECT_EQ(upstream_classes("rt_detr_v2", K::pooled_shortcut,
                             "model.backbone.model.encoder.stages.1.layers.0.shortcut.0"),
            std::vector<std::string>{"AvgPool2d"});
  EXPECT_TRUE(upstream_classes("d_fine", K::pooled_shortcut, "x").empty());
  EXPECT_TRUE(upstream_classes("deformable_detr", K::pooled_shortcut, "x").empty());
  // DEIMv2: HGNetV2 under model.conv_encoder.model, the DINOv3 ViT under .backbone.
  EXPECT_EQ(upstream_classes("deimv2", K::conv_norm, "model.conv_encoder.model.embedder.stem1"),
            std::vector<std::string>{"HGNetV2ConvLayer"});
  EXPECT_EQ(upstream_classes("deimv2", K::conv_norm, "model.conv_encoder.encoder_input_proj.0"),
            std::vector<std::string>{"Deimv2ConvNormLayer"});
  EXPECT_EQ(
      upstream_classes("deimv2", K::conv_norm, "model.conv_encoder.spatial_tuning_adapter.conv2"),
      std::vector<std::string>{"Deimv2ConvNormLayer"});
  EXPECT_EQ(upstream_classes("deimv2", K::repvgg_block, "x"),
            std::vector<std::string>{"Deimv2RepVggBlock"});
  EXPECT_EQ(upstream_classes("deimv2", K::attention, "model.decoder.layers.0.self_attn"),
            std::vector<std::string>{"Deimv2SelfAttention"});
  EXPECT_EQ(
      upstream_classes("deimv2", K::attention, "model.conv_encoder.backbone.layer.0.attention"),
      std::vector<std::string>{"DINOv3ViTAttention"});
  EXPECT_TRUE(upstream_classes("deimv2", K::pooled_shortcut, "x").empty());
  // LW-DETR / RF-DETR: the ViT backbone's attention and the decoder's; only LW-DETR's projector
  // ConvNorms have a BatchNorm.
  EXPECT_EQ(upstream_classes("lw_detr", K::attention,
                             "model.backbone.backbone.encoder.layer.0.attention.attention"),
            std::vector<std::string>{"LwDetrViTAttention"});
  EXPECT_EQ(upstream_classes("lw_detr", K::attention, "model.decoder.layers.0.self_attn"),
            std::vector<std::string>{"LwDetrAttention"});
  EXPECT_EQ(upstream_classes("lw_detr", K::conv_norm,
                             "model.backbone.projector.scale_layers.0.projector_layer.conv1"),
            std::vector<std::string>{"LwDetrConvNormLayer"});
  EXPECT_EQ(upstream_classes("rf_detr", K::attention,
                             "model.backbone.backbone.encoder.layer.0.attention.attention"),
            (std::vector<std::string>{"RfDetrDinov2SelfAttention", "RfDetrDinov2Attention"}));
  EXPECT_EQ(upstream_classes("rf_detr", K::attention, "model.decoder.layers.1.self_attn"),
            std::vector<std::string>{"RfDetrAttention"});
  EXPECT_TRUE(upstream_classes("rf_detr", K::conv_norm, "model.backbone.projector.conv1").empty());
  EXPECT_TRUE(path_matches("model.encoder.*.0", "model.encoder.fpn_blocks.0"));
  EXPECT_FALSE(path_matches("model.encoder.*", "model.encoder.fpn_blocks.0"));
  EXPECT_FALSE(path_matches("model.encoder.*.1", "model.encoder.fpn_blocks.0"));
  EXPECT_TRUE(on_by_default("batchnorm_fold", "rt_detr", false));
  EXPECT_TRUE(
      on_by_default("channels_last", "rt_detr", false));         // CUDA only: its predicate decides
  EXPECT_FALSE(on_by_default("channels_last", "vit", false));    // no conv stack
  EXPECT_TRUE(on_by_default("avgpool_fold", "rt_detr", false));  // measured: R50 batch 32 -8%
  EXPECT_FALSE(on_by_default("avgpool_fold", "vit", false));
  // CUDA float32 without TF32 (cuDNN's FMA kernels) and the CPU: neither channels_last nor
  // avgpool_fold; the folds that remove passes stay on.
  EXPECT_FALSE(on_by_default("channels_last", "rt_detr", true));
  EXPECT_FALSE(on_by_default("avgpool_fold", "rt_detr", true));
  EXPECT_TRUE(on_by_default("batchnorm_fold", "rt_detr", true));
  EXPECT_TRUE(on_by_default("repvgg", "d_fine", true));
  EXPECT_TRUE(on_by_default("qkv_concat", "vit", true));
  // DEIMv2 as D-FINE; LW-DETR qkv_concat, batchnorm_fold and channels_last (its projector,
  // not for FMA convolutions), RF-DETR qkv_concat and channels_last (its projector).
  for (const char* layout : {"repvgg", "batchnorm_fold", "qkv_concat", "channels_last"})
    EXPECT_TRUE(on_by_default(layout, "deimv2", false)) << layout;
  EXPECT_FALSE(on_by_default("channels_last", "deimv2", true));
  EXPECT_TRUE(on_by_default("qkv_concat", "lw_detr", false));
  EXPECT_TRUE(on_by_default("batchnorm_fold", "lw_detr", false));
  EXPECT_TRUE(on_by_default("channels_last", "lw_detr", false));
  EXPECT_FALSE(on_by_default("channels_last", "lw_detr", true));
  EXPECT_TRUE(on_by_default("qkv_concat", "rf_detr", false));
  EXPECT_FALSE(on_by_default("batchnorm_fold", "rf_detr", false));
  EXPECT_TRUE(on_by_default("channels_last", "rf_detr", false));
  EXPECT_FALSE(on_by_default("channels_last", "rf_detr", true));
}

}  // namespace
}  // namespace libreyolo::models::layouts
