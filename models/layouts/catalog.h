// The built-in layouts by name, the transformers classes each replaces, and which module of a
// family is which transformers class: the class lists and the per-family defaults come from the
// families' registration records (models/registry/family.h). No torch dependency: the
// serving.yaml parser checks `kernel_config:` against it before any model loads.
#pragma once

#include <string>
#include <vector>

namespace libreyolo::models::layouts {

/// A built-in layout's name and what it replaces.
struct LayoutInfo {
  std::string name;
  /// transformers (or torch.nn) class names: every registered family's (in FamilyRegistry::all()
  /// order, each once), then the layout's own torch.nn class (channels_last: Conv2d)
  std::vector<std::string> replaces;
  std::string summary;  ///< one line, for docs and --help
};

/// Every built-in layout, in the order load_model applies them (repvgg before batchnorm_fold:
/// it merges the branches' norms itself; avgpool_fold after it, folding the norm itself when
/// batchnorm_fold did not; channels_last last: it converts the folded weights).
const std::vector<LayoutInfo>& layout_catalog();

/// The catalog entry called `name`, or nullptr.
const LayoutInfo* find_layout_info(const std::string& name);

/// Whether `layout` is on under `kernels.layouts: default` for a `model_type` model: in its
/// family's Family::default_layouts (decided by the parity gate,
/// tests/parity/layouts_parity_test.cpp; DESIGN.md "Layouts"), except that with
/// `fma_convolutions`, a CUDA float32 model without TF32 (cuDNN's FMA kernels) or a CPU model,
/// channels_last and avgpool_fold are off (measured slower: docs/BENCHMARKS.md "fifth run" on
/// CUDA; on the CPU RT-DETR-R50 fp32 batch 1 1,292 ms with avgpool_fold, 1,165-1,186 ms
/// without, R18 unchanged; BENCHMARKS "quiet: RT-DETR-R50 and D-FINE L"); a `reduced_precision`
/// model (bfloat16 / float16) also takes Family::reduced_precision_layouts. False for a model_type
/// no family registers.
bool on_by_default(const std::string& layout, const std::string& model_type, bool fma_convolutions,
                   bool reduced_precision = false);

/// Module kinds of our tree a layout looks at.
/// pooled_shortcut: a ResNet-vd layer whose shortcut is AvgPool2d + 1x1 conv-BN (its path is
/// the AvgPool2d's, "<layer>.shortcut.0").
enum class ModuleKind { conv_norm, repvgg_block, attention, conv2d, pooled_shortcut };

/// The transformers class names of a module of `kind` at dotted `path` in a `model_type` model
/// (first = the class itself, then older spellings), e.g. rt_detr, a ConvNorm below
/// "model.backbone." -> {"RTDetrResNetConvLayer"}: the first of the family's
/// Family::layout_classes rules for the kind's layout that matches; conv2d: {"Conv2d"} in every
/// family. Empty when the family has no such class or no family registers `model_type`.
std::vector<std::string> upstream_classes(const std::string& model_type, ModuleKind kind,
                                          const std::string& path);

/// True when dotted `path` matches `pattern` segment by segment (`*` = exactly one segment).
bool path_matches(const std::string& pattern, const std::string& path);

}  // namespace libreyolo::models::layouts
