// Layouts (Hugging Face's KernelConfig idea, in-tree): once, after a checkpoint's
// tensors are loaded, a layout rewrites modules of the tree into a faster equivalent form: the
// conversion mapping (fold, concatenate, re-parameterise, change memory format) is applied to
// the loaded tensors and the module switches to its fused forward, which calls the kernel slots
// (conv2d_bias_act). Which layouts run: LayoutOptions (kernels.layouts / LIBREYOLO_LAYOUTS and
// serving.yaml `kernel_config:`); what they did: LayoutReport (Model::layouts()).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "models/layouts/catalog.h"
#include "models/layouts/options.h"

namespace libreyolo::models::layouts {

/// What a layout runs for.
struct LayoutContext {
  std::string model_type;  ///< config.json model_type
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  /// TF32 allowed in cuDNN convolutions (at::globalContext().allowTF32CuDNN() when the model
  /// loads): float32 convolutions then run on tensor cores, whose kernels are NHWC.
  bool tf32 = false;
};

/// Why `layout` cannot run in `ctx` (a string literal), or nullptr when it can (the predicate:
/// channels_last needs CUDA; the others run everywhere).
const char* unsupported(const std::string& layout, const LayoutContext& ctx);

/// Applies the layouts `options` selects to `root` (the model's module tree, tensors already on
/// ctx.device in ctx.dtype), in layout_catalog() order. Returns one report per layout that
/// replaced at least one module. `mode` off: changes nothing and returns {}. Throws
/// std::runtime_error naming the entry for a kernel_config entry that cannot be honoured (a hub
/// reference: no hub provider supplies layouts). Not thread-safe: call before any forward().
std::vector<LayoutReport> apply_layouts(torch::nn::Module& root, const LayoutContext& ctx,
                                        const LayoutOptions& options);

/// Elements of `m`'s parameters and buffers, its children included.
int64_t count_elements(const torch::nn::Module& m);

}  // namespace libreyolo::models::layouts
