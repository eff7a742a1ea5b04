#include "models/layouts/layouts.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "models/layers/attention.h"
#include "models/layers/layers.h"
#include "models/layers/layout_targets.h"

namespace libreyolo::models::layouts {
namespace {

/// A module a layout may replace.
struct Candidate {
  std::string path;
  std::vector<std::string> classes;
  std::shared_ptr<torch::nn::Module> module;
};

std::vector<Candidate> find_candidates(torch::nn::Module& root, const std::string& model_type,
                                       const std::string& layout) {
  std::vector<Candidate> out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    torch::nn::Module* m = item.value().get();
    ModuleKind kind;
    std::string path = item.key();
    if (layout == "batchnorm_fold" &&
        (dynamic_cast<layers::ConvNormImpl*>(m) || dynamic_cast<layers::SiblingConvNorms*>(m)))
      kind = ModuleKind::conv_norm;
    else if (layout == "avgpool_fold" && dynamic_cast<layers::PooledShortcut*>(m) &&
             dynamic_cast<layers::PooledShortcut*>(m)->pooled_shortcut())
      kind = ModuleKind::pooled_shortcut, path += ".shortcut.0";
    else if (layout == "repvgg" && dynamic_cast<layers::RepVggBranches*>(m))
      kind = ModuleKind::repvgg_block;
    else if (layout == "qkv_concat" && dynamic_cast<layers::AttentionImpl*>(m))
      kind = ModuleKind::attention;
    else if (layout == "channels_last" && dynamic_cast<layers::Conv2dImpl*>(m))
      kind = ModuleKind::conv2d;
    else
      continue;
    auto classes = upstream_classes(model_type, kind, path);
    // A rule may list several classes for one path pattern (timm's Bottleneck and BasicBlock);
    // a module that knows its own class is that one alone.
    if (const auto* siblings = dynamic_cast<layers::SiblingConvNorms*>(m)) {
      const auto own = siblings->upstream_class();
      if (std::find(classes.begin(), classes.end(), own) != classes.end()) classes = {own};
    }
    if (!classes.empty()) out.push_back({path, std::move(classes), item.value()});
  }
  return out;
}

bool entry_matches(const KernelConfigEntry& e, const Candidate& c) {
  for (const auto& t : e.targets) {
    bool cls = false;
    for (const auto& name : c.classes) cls = cls || name == t.class_name;
    if (cls && (t.path_pattern.empty() || path_matches(t.path_pattern, c.path))) return true;
  }
  return false;
}

/// Whether `layout` replaces candidate `c`, and why ("" = it does not).
std::string decide(const std::string& layout, const Candidate& c, const LayoutContext& ctx,
                   const LayoutOptions& o) {
  for (const auto& e : o.kernel_config) {
    if (!entry_matches(e, c)) continue;
    if (e.value != layout) return "";  // "off", or (never, after validation) another layout
    return "kernel_config: " + e.key + (e.origin.empty() ? "" : " (" + e.origin + ")");
  }
  const auto& mode = o.mode;
  if (mode.value == kernels::LayoutMode::on)
    return std::string("kernels.layouts: on") +
           (mode.origin.empty() ? "" : " (" + mode.origin + ")");
  // Convolutions at FMA rate: CUDA float32 without TF32 (cuDNN's kernels without tensor cores),
  // and the CPU (oneDNN / ATen on AVX2 or AVX-512 FMA units).
  const bool fma_convolutions =
      (ctx.device.is_cuda() && ctx.dtype == at::kFloat && !ctx.tf32) || ctx.device.is_cpu();
  if (mode.value == kernels::LayoutMode::family_default &&
      on_by_default(layout, ctx.model_type, fma_convolutions,
                    ctx.dtype == at::kBFloat16 || ctx.dtype == at::kHalf))
    return "default (" + ctx.model_type + ")";
  return "";
}

// ---- the conversion mappings ------------------------------------------------------------------

/// A convolution with its norm folded in, in float64: W' = W * s, b' = b * s + t with the norm's
/// per-channel scale s and shift t (transformers *FrozenBatchNorm2d: s = w * rsqrt(var + 1e-5),
/// t = bias - mean * s; nn.BatchNorm2d in eval: the same with the module's eps).
struct FoldedConv {
  at::Tensor weight, bias;
};

/// `conv` followed by `frozen` or `norm` (one of them set; neither: `conv` as it is).
FoldedConv folded_weights(const layers::Conv2dImpl& conv,
                          const layers::FrozenBatchNorm2dImpl* frozen,
                          const layers::BatchNorm2dImpl* norm) {
  const auto w = conv.weight.to(at::kDouble);
  at::Tensor b =
      conv.bias.defined() ? conv.bias.to(at::kDouble) : at::zeros({w.size(0)}, w.options());
  if (!frozen && !norm) return {w, b};
  at::Tensor scale, shift;
  if (frozen) {
    scale = frozen->weight.to(at::kDouble) * (frozen->running_var.to(at::kDouble) + 1e-5).rsqrt();
    shift = frozen->bias.to(at::kDouble) - frozen->running_mean.to(at::kDouble) * scale;
  } else {
    scale = norm->weight.to(at::kDouble) * (norm->running_var.to(at::kDouble) + norm->eps).rsqrt();
    shift = norm->bias.to(at::kDouble) - norm->running_mean.to(at::kDouble) * scale;
  }
  return {w * scale.view({-1, 1, 1, 1}), b * scale + shift};
}

FoldedConv folded_weights(const layers::ConvNormImpl& m) {
  if (m.folded) return folded_weights(*m.conv, nullptr, nullptr);
  return folded_weights(*m.conv, m.frozen_norm.get(), m.norm.get());
}

/// Writes folded weights into `conv` (cast to its dtype), giving it a bias parameter.
void install_weights(layers::Conv2dImpl& conv, const FoldedConv& f) {
  at::NoGradGuard no_grad;
  conv.weight.copy_(f.weight);
  const auto bias = f.bias.to(conv.weight.options());
  if (conv.bias.defined())
    conv.bias.copy_(bias);
  else
    conv.bias = conv.register_parameter("bias", bias, /*requires_grad=*/false);
  conv.options.bias = true;
}

/// Unregisters the child of `owner` that is `child`, if any.
void unregister_child(torch::nn::Module& owner, const torch::nn::Module* child) {
  for (const auto& c : owner.named_children())
    if (c.value().get() == child) owner.unregister_module(c.key());
}

/// Installs folded weights into `m`, removes its norm child and switches it to the
/// conv2d_bias_act forward with activation `act`.
void install_folded(layers::ConvNormImpl& m, const FoldedConv& f, layers::Activation act) {
  install_weights(*m.conv, f);
  unregister_child(m, m.norm.get());
  unregister_child(m, m.frozen_norm.get());
  m.norm = nullptr;
  m.frozen_norm = nullptr;
  m.act = act;
  m.folded = true;
}

/// batchnorm_fold on one ConvNorm, or on every pair of a SiblingConvNorms module. False when
/// already folded.
bool fold(torch::nn::Module& module) {
  if (auto* siblings = dynamic_cast<layers::SiblingConvNorms*>(&module)) {
    if (siblings->folded) return false;
    for (const auto& p : siblings->conv_norm_pairs()) {
      install_weights(**p.conv, folded_weights(**p.conv, p.norm->get(), nullptr));
      unregister_child(*p.owner, p.norm->get());
      *p.norm = nullptr;
    }
    siblings->folded = true;
    return true;
  }
  auto& m = dynamic_cast<layers::ConvNormImpl&>(module);
  // No BatchNorm: RF-DETR's ConvNorms normalise with LayerNorm (lw_detr::ConvNormLayerImpl).
  if (m.folded || (!m.norm && !m.frozen_norm)) return false;
  install_folded(m, folded_weights(m), m.act);
  return true;
}

/// repvgg on one RepVGG block (lyuwenyu/RT-DETR rtdetr_pytorch/src/zoo/rtdetr/hybrid_encoder.py
/// RepVggBlock.get_equivalent_kernel_bias: both branches folded, the 1x1 kernel zero-padded to
/// 3x3 and added). False when already re-parameterised or the geometry is not 3x3 + 1x1.
bool reparameterize(torch::nn::Module& module) {
  auto& block = dynamic_cast<layers::RepVggBranches&>(module);
  if (block.reparameterized || !block.conv2) return false;
  const auto& o3 = block.conv1->conv->options;
  const auto& o1 = block.conv2->conv->options;
  if (o3.kernel != 3 || o3.padding != 1 || o1.kernel != 1 || o1.padding != 0 || o3.stride != 1 ||
      o1.stride != 1 || o3.groups != 1 || o1.groups != 1 || o3.dilation != 1 || o1.dilation != 1 ||
      block.conv1->act != layers::Activation::none || block.conv2->act != layers::Activation::none)
    return false;
  const auto a = folded_weights(*block.conv1);
  const auto b = folded_weights(*block.conv2);
  install_folded(*block.conv1,
                 {a.weight + at::constant_pad_nd(b.weight, {1, 1, 1, 1}), a.bias + b.bias},
                 block.act);
  module.unregister_module("conv2");
  block.conv2 = nullptr;
  block.reparameterized = true;
  return true;
}

/// avgpool_fold on one ResNet-vd layer: AvgPool2d(2, 2) then a 1x1 stride-1 conv (+ norm) is,
/// on whole 2x2 windows, y = sum_{i,j in 2x2} (W/4) x_ij + b: a 2x2 stride-2 convolution whose
/// four taps are the folded 1x1 weight / 4 (exact: / 4 is a power of two). Installed as the
/// shortcut's `pooled` child (a Conv2d, so channels_last converts it too); the 1x1 conv stays for
/// odd sides. False when already done or the projection is not a plain 1x1 stride-1 conv.
bool fold_avgpool(torch::nn::Module& module) {
  auto sc = dynamic_cast<layers::PooledShortcut&>(module).pooled_shortcut();
  if (!sc || sc->pooled) return false;
  const auto& o = sc->conv->options;
  if (o.kernel != 1 || o.stride != 1 || o.padding != 0 || o.groups != 1 || o.dilation != 1 ||
      sc->conv->weight.dim() != 4)
    return false;
  const auto f = folded_weights(*sc);
  const auto& like = sc->conv->weight;
  layers::Conv2dOptions p = o;
  p.kernel = 2;
  p.stride = 2;
  p.bias = false;  // registered below with the folded values
  auto conv = std::make_shared<layers::Conv2dImpl>(p);
  at::NoGradGuard no_grad;
  conv->weight.set_data((f.weight / 4).expand({-1, -1, 2, 2}).contiguous().to(like.options()));
  conv->bias = conv->register_parameter("bias", f.bias.to(like.options()), /*requires_grad=*/false);
  conv->options.bias = true;
  conv->weight.set_requires_grad(false);
  sc->pooled = sc->register_module("pooled", conv);
  return true;
}

/// qkv_concat on one attention module: [q; k; v] rows in one weight, the three projections'
/// weights become views into it (no extra memory). A projection without a bias next to biased
/// ones (LwDetrViTAttention's k_proj, DINOv3ViTAttention's with key_bias false) contributes zero
/// rows to in_proj_bias: adding 0 is exact, and it keeps no bias of its own. False when the
/// projections differ in shape.
bool concat_qkv(torch::nn::Module& module) {
  auto& a = dynamic_cast<layers::AttentionImpl&>(module);
  if (a.concat_projections != 0) return false;
  const auto& q = a.q_proj->weight;
  const auto& k = a.k_proj->weight;
  const auto& v = a.v_proj->weight;
  if (q.sizes() != k.sizes() || q.sizes() != v.sizes()) return false;
  layers::Linear projections[] = {a.q_proj, a.k_proj, a.v_proj};
  bool biased = false;
  for (const auto& p : projections) biased = biased || p->bias.defined();
  const int64_t D = q.size(0);
  at::NoGradGuard no_grad;
  a.in_proj_weight = at::cat({q, k, v}, 0);
  if (biased) {
    std::vector<at::Tensor> biases;
    for (const auto& p : projections)
      biases.push_back(p->bias.defined() ? p->bias : at::zeros({D}, q.options()));
    a.in_proj_bias = at::cat(biases, 0);
  }
  for (int64_t i = 0; i < 3; ++i) {
    projections[i]->weight.set_(a.in_proj_weight.narrow(0, i * D, D));
    if (projections[i]->bias.defined())
      projections[i]->bias.set_(a.in_proj_bias.narrow(0, i * D, D));
  }
  a.concat_projections = 3;
  return true;
}

/// channels_last on one convolution. False when the weight already is.
bool to_channels_last(torch::nn::Module& module) {
  auto& c = dynamic_cast<layers::Conv2dImpl&>(module);
  if (c.weight.dim() != 4 || c.weight.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  at::NoGradGuard no_grad;
  c.weight.set_(c.weight.contiguous(at::MemoryFormat::ChannelsLast));
  return true;
}

bool apply_one(const std::string& layout, torch::nn::Module& m) {
  if (layout == "batchnorm_fold") return fold(m);
  if (layout == "repvgg") return reparameterize(m);
  if (layout == "avgpool_fold") return fold_avgpool(m);
  if (layout == "qkv_concat") return concat_qkv(m);
  if (layout == "channels_last") return to_channels_last(m);
  return false;
}

}  // namespace

int64_t count_elements(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) n += p.numel();
  for (const auto& b : m.buffers(/*recurse=*/true)) n += b.numel();
  return n;
}

const char* unsupported(const std::string& layout, const LayoutContext& ctx) {
  if (layout == "channels_last" && !ctx.device.is_cuda()) return "needs a CUDA device";
  return nullptr;
}

std::vector<LayoutReport> apply_layouts(torch::nn::Module& root, const LayoutContext& ctx,
                                        const LayoutOptions& options) {
  if (options.mode.value == kernels::LayoutMode::off) return {};
  for (const auto& e : options.kernel_config) {
    if (e.is_hub())
      throw std::runtime_error(
          "kernel_config: " + e.key + (e.origin.empty() ? "" : " (" + e.origin + ")") + ": '" +
          e.value +
          "' cannot be loaded: the pinned hub provider (kernels.lock) supplies kernel slot ops, "
          "not layouts (use a built-in layout name or off)");
  }
  std::vector<LayoutReport> reports;
  for (const auto& info : layout_catalog()) {
    if (unsupported(info.name, ctx)) continue;
    std::map<std::string, LayoutReport> by_source;  // one report per (layout, source)
    std::map<std::string, std::set<std::string>> classes;
    for (const auto& c : find_candidates(root, ctx.model_type, info.name)) {
      const std::string source = decide(info.name, c, ctx, options);
      if (source.empty()) continue;
      const int64_t before = count_elements(*c.module);
      if (!apply_one(info.name, *c.module)) continue;
      auto& r = by_source[source];
      r.layout = info.name;
      r.source = source;
      r.modules += 1;
      r.params_before += before;
      r.params_after += count_elements(*c.module);
      classes[source].insert(c.classes.front());
    }
    for (auto& [source, r] : by_source) {
      r.classes.assign(classes[source].begin(), classes[source].end());
      reports.push_back(std::move(r));
    }
  }
  return reports;
}

}  // namespace libreyolo::models::layouts
