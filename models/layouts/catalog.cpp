#include "models/layouts/catalog.h"

#include <algorithm>
#include <sstream>

#include "models/layouts/options.h"

namespace libreyolo::models::layouts {

const std::vector<LayoutInfo>& layout_catalog() {
  static const std::vector<LayoutInfo> catalog{
      {"repvgg",
       {"RTDetrRepVggBlock", "RTDetrV2RepVggBlock", "DFineRepVggBlock", "Deimv2RepVggBlock"},
       "RepVGG re-parameterisation: the 3x3 and 1x1 conv-BN branches become one 3x3 convolution "
       "with bias (RT-DETR deploy mode)"},
      {"batchnorm_fold",
       {"RTDetrResNetConvLayer", "RTDetrResNetShortCut", "RTDetrConvNormLayer",
        "RTDetrV2ConvNormLayer", "DFineConvNormLayer", "Deimv2ConvNormLayer", "HGNetV2ConvLayer",
        "LwDetrConvNormLayer", "ResNetConvLayer", "ResNetShortCut", "Sequential"},
       "BatchNorm / FrozenBatchNorm folded into the preceding convolution; conv2d_bias_act with "
       "the activation (and a ResNet layer's residual add) fused"},
      {"avgpool_fold",
       {"AvgPool2d"},
       "ResNet-vd shortcut: AvgPool2d(2, 2, ceil_mode) and the 1x1 conv-BN after it become one "
       "2x2 stride-2 convolution with bias (weights / 4) for inputs with even sides"},
      {"qkv_concat",
       {"ViTAttention", "ViTSelfAttention", "DeiTAttention", "SwinAttention", "SwinSelfAttention",
        "RTDetrSelfAttention", "RTDetrV2SelfAttention", "DFineSelfAttention", "Deimv2SelfAttention",
        "DINOv3ViTAttention", "DeformableDetrSelfAttention", "LwDetrViTAttention",
        "LwDetrAttention", "RfDetrDinov2SelfAttention", "RfDetrDinov2Attention", "RfDetrAttention"},
       "q/k/v projections concatenated: one GEMM for the projections whose inputs are the same "
       "tensor (q, k, v in ViT/DeiT/Swin and the detectors' ViT backbones; q, k in the DETR "
       "self-attentions)"},
      {"channels_last",
       {"Conv2d"},
       "CUDA only: convolution weights (hence activations) in channels_last memory format"},
  };
  return catalog;
}

const LayoutInfo* find_layout_info(const std::string& name) {
  for (const auto& l : layout_catalog())
    if (l.name == name) return &l;
  return nullptr;
}

bool on_by_default(const std::string& layout, const std::string& model_type,
                   bool fma_convolutions) {
  // The parity gate (CPU float32 against transformers, tests/parity/layouts_parity_test.cpp;
  // CUDA float32 with TF32 off, tests/gpu/layouts_cuda_test.cpp) passed for every layout on
  // every family. channels_last (CUDA only, its predicate) is on for the conv families: it
  // removes cuDNN's NCHW<->NHWC transposes, 4.8 of 46 ms of an R50 batch-32 bf16 forward
  // (docs/BENCHMARKS.md "Against torch.compile").
  static const std::vector<std::string> detectors{"rt_detr", "rt_detr_v2", "d_fine", "deimv2",
                                                  "deformable_detr"};
  static const std::vector<std::string> all{
      "rt_detr", "rt_detr_v2", "d_fine", "deimv2", "deformable_detr",
      "lw_detr", "rf_detr",    "vit",    "deit",   "swin"};
  auto in = [&](const std::vector<std::string>& v) {
    return std::find(v.begin(), v.end(), model_type) != v.end();
  };
  // CUDA float32 without TF32 runs cuDNN's FMA convolutions (no tensor cores), whose fast kernels
  // are NCHW (sm80_xmma_fprop_implicit_gemm_f32f32_..._nchwkcrs_nchw: 96 of 157 ms of an
  // RT-DETR-R50 batch-32 forward): the defaults gave 162.7 ms with channels_last, 139.7 without,
  // and avgpool_fold's 2x2 convolution, 4x the FLOPs of the 1x1 shortcut it replaces (about
  // 480 GFLOP more per R50 batch-32 forward), costs more at FMA rate than the avg_pool2d pass
  // it removes (1.1 ms): 139.7 -> 128.6 ms without it. docs/BENCHMARKS.md "fifth run". (CPU
  // defaults are unchanged: not measured there.)
  if (fma_convolutions && (layout == "channels_last" || layout == "avgpool_fold")) return false;
  if (layout == "repvgg" || layout == "channels_last") return in(detectors);
  // LW-DETR's projector ConvNorms are conv + BatchNorm2d (RF-DETR's normalise with LayerNorm:
  // no fold). Not channels_last: its ViT backbone is GEMMs, the projector a few convolutions.
  if (layout == "batchnorm_fold") return in(detectors) || model_type == "lw_detr";
  if (layout == "qkv_concat") return in(all);
  // avgpool_fold (ResNet-vd shortcuts only: its predicate): parity-exact (layouts_parity_test.cpp)
  // and, although the 2x2 stride-2 conv has 4x the 1x1 shortcut's FLOPs, it removes the NHWC
  // avg_pool2d kernel (2.3 of 21 ms): RT-DETR-R50 bf16 batch 32 21.05 -> 19.37 ms on the H200
  // (docs/BENCHMARKS.md "Against torch.compile", 2026-12-01 second run).
  if (layout == "avgpool_fold") return in(detectors);
  return false;
}

namespace {

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) out.push_back(part);
  return out;
}

bool has_segment(const std::string& path, const std::string& segment) {
  const auto parts = split(path);
  return std::find(parts.begin(), parts.end(), segment) != parts.end();
}

}  // namespace

std::vector<std::string> upstream_classes(const std::string& model_type, ModuleKind kind,
                                          const std::string& path) {
  const bool rtdetr = model_type == "rt_detr" || model_type == "rt_detr_v2";
  const std::string prefix = model_type == "rt_detr"      ? "RTDetr"
                             : model_type == "rt_detr_v2" ? "RTDetrV2"
                             : model_type == "d_fine"     ? "DFine"
                             : model_type == "deimv2"     ? "Deimv2"
                                                          : "";
  const bool backbone = has_segment(path, "backbone");
  // DEIMv2: the HGNetV2 backbone is "model.conv_encoder.model", the DINOv3 ViT
  // "model.conv_encoder.backbone" (Deimv2ConvEncoder / Deimv2DINOv3ConvEncoder).
  const bool deimv2_hgnet =
      model_type == "deimv2" && path.rfind("model.conv_encoder.model.", 0) == 0;
  switch (kind) {
    case ModuleKind::conv_norm:
      // encoder_input_proj / decoder_input_proj: nn.Sequential(nn.Conv2d, nn.BatchNorm2d)
      // upstream (modeling_rt_detr.py, modeling_d_fine.py), no class of their own.
      if ((rtdetr || model_type == "d_fine") &&
          (has_segment(path, "encoder_input_proj") || has_segment(path, "decoder_input_proj")))
        return {"Sequential"};
      if (rtdetr && backbone)
        return {has_segment(path, "shortcut") ? "RTDetrResNetShortCut" : "RTDetrResNetConvLayer"};
      if ((model_type == "d_fine" && backbone) || deimv2_hgnet) return {"HGNetV2ConvLayer"};
      if (!prefix.empty()) return {prefix + "ConvNormLayer"};
      // RF-DETR's RfDetrConvNormLayer normalises with LayerNorm (statistics of each pixel's
      // channels at run time, not per-channel constants): nothing to fold.
      if (model_type == "lw_detr") return {"LwDetrConvNormLayer"};
      if (model_type == "deformable_detr")
        return {has_segment(path, "shortcut") ? "ResNetShortCut" : "ResNetConvLayer"};
      return {};
    case ModuleKind::repvgg_block:
      if (!prefix.empty()) return {prefix + "RepVggBlock"};
      return {};
    case ModuleKind::attention:
      if (model_type == "vit") return {"ViTAttention", "ViTSelfAttention"};
      if (model_type == "deit") return {"DeiTAttention"};  // 5.17: no DeiTSelfAttention
      if (model_type == "swin") return {"SwinAttention", "SwinSelfAttention"};
      if (model_type == "deimv2" && backbone) return {"DINOv3ViTAttention"};
      if (!prefix.empty()) return {prefix + "SelfAttention"};
      if (model_type == "deformable_detr") return {"DeformableDetrSelfAttention"};
      // LW-DETR / RF-DETR: the ViT backbone's attention, then the decoder self-attention.
      if (model_type == "lw_detr") return {backbone ? "LwDetrViTAttention" : "LwDetrAttention"};
      if (model_type == "rf_detr") {
        if (backbone) return {"RfDetrDinov2SelfAttention", "RfDetrDinov2Attention"};
        return {"RfDetrAttention"};
      }
      return {};
    case ModuleKind::conv2d:
      return {"Conv2d"};
    case ModuleKind::pooled_shortcut:
      if (rtdetr) return {"AvgPool2d"};
      return {};
  }
  return {};
}

bool path_matches(const std::string& pattern, const std::string& path) {
  const auto p = split(pattern), s = split(path);
  if (p.size() != s.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != s[i]) return false;
  return true;
}

std::string describe(const std::vector<LayoutReport>& reports) {
  if (reports.empty()) return "layouts: none applied\n";
  std::ostringstream out;
  for (const auto& r : reports) {
    out << "layout " << r.layout << ": " << r.modules << " modules (";
    for (size_t i = 0; i < r.classes.size(); ++i) out << (i ? ", " : "") << r.classes[i];
    out << "), parameters " << r.params_before << " -> " << r.params_after << ", source "
        << r.source << "\n";
  }
  return out.str();
}

}  // namespace libreyolo::models::layouts
