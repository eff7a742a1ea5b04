#include "models/layouts/catalog.h"

#include <algorithm>
#include <sstream>

#include "models/layouts/options.h"
#include "models/registry/family.h"

namespace libreyolo::models::layouts {
namespace {

/// The layout that looks at modules of `kind`.
const char* layout_of(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::conv_norm:
      return "batchnorm_fold";
    case ModuleKind::repvgg_block:
      return "repvgg";
    case ModuleKind::attention:
      return "qkv_concat";
    case ModuleKind::conv2d:
      return "channels_last";
    case ModuleKind::pooled_shortcut:
      return "avgpool_fold";
  }
  return "";
}

/// Every registered family's classes for `layout`, each once, then `own` (the layout's torch.nn
/// class, for every family).
std::vector<std::string> replaced_classes(const std::string& layout,
                                          const std::vector<std::string>& own = {}) {
  std::vector<std::string> out;
  auto add = [&](const std::string& c) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  for (const Family* f : FamilyRegistry::builtin().all())
    for (const auto& rule : f->layout_classes)
      if (rule.layout == layout)
        for (const auto& c : rule.classes) add(c);
  for (const auto& c : own) add(c);
  return out;
}

}  // namespace

const std::vector<LayoutInfo>& layout_catalog() {
  // Built on first use, after every family's registrar ran (they run when the library loads).
  static const std::vector<LayoutInfo> catalog{
      {"repvgg", replaced_classes("repvgg"),
       "RepVGG re-parameterisation: the 3x3 and 1x1 conv-BN branches become one 3x3 convolution "
       "with bias (RT-DETR deploy mode)"},
      {"batchnorm_fold", replaced_classes("batchnorm_fold"),
       "BatchNorm / FrozenBatchNorm folded into the preceding convolution; conv2d_bias_act with "
       "the activation (and a ResNet layer's residual add) fused"},
      {"avgpool_fold", replaced_classes("avgpool_fold"),
       "ResNet-vd shortcut: AvgPool2d(2, 2, ceil_mode) and the 1x1 conv-BN after it become one "
       "2x2 stride-2 convolution with bias (weights / 4) for inputs with even sides"},
      {"qkv_concat", replaced_classes("qkv_concat"),
       "q/k/v projections concatenated: one GEMM for the projections whose inputs are the same "
       "tensor (q, k, v in ViT/DeiT/Swin and the detectors' ViT backbones; q, k in the DETR "
       "self-attentions)"},
      {"channels_last", replaced_classes("channels_last", {"Conv2d"}),
       "CUDA only: convolution weights (hence activations) in channels_last memory format"},
  };
  return catalog;
}

const LayoutInfo* find_layout_info(const std::string& name) {
  for (const auto& l : layout_catalog())
    if (l.name == name) return &l;
  return nullptr;
}

bool on_by_default(const std::string& layout, const std::string& model_type, bool fma_convolutions,
                   bool reduced_precision) {
  // CUDA float32 without TF32 runs cuDNN's FMA convolutions (no tensor cores), whose fast kernels
  // are NCHW: channels_last measured slower there, and avgpool_fold's 2x2 convolution, 4x the
  // FLOPs of the 1x1 shortcut it replaces, costs more at FMA rate than the avg_pool2d pass it
  // removes (docs/BENCHMARKS.md "fifth run"). The CPU convolves at FMA rate too: there the fold
  // cost RT-DETR-R50 8% of its batch-1 forward (BENCHMARKS "quiet: RT-DETR-R50 and D-FINE L").
  if (fma_convolutions && (layout == "channels_last" || layout == "avgpool_fold")) return false;
  const Family* family = FamilyRegistry::builtin().find(model_type);
  if (!family) return false;
  auto listed = [&](const std::vector<std::string>& on) {
    return std::find(on.begin(), on.end(), layout) != on.end();
  };
  return listed(family->default_layouts) ||
         (reduced_precision && listed(family->reduced_precision_layouts));
}

namespace {

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) out.push_back(part);
  return out;
}

}  // namespace

std::vector<std::string> upstream_classes(const std::string& model_type, ModuleKind kind,
                                          const std::string& path) {
  if (kind == ModuleKind::conv2d) return {"Conv2d"};
  const Family* family = FamilyRegistry::builtin().find(model_type);
  if (!family) return {};
  const std::string layout = layout_of(kind);
  for (const auto& rule : family->layout_classes) {
    if (rule.layout != layout || (!rule.model_type.empty() && rule.model_type != model_type))
      continue;
    if (!rule.where || rule.where(path)) return rule.classes;
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
