#include "models/swin/timm_config.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string>

namespace libreyolo::models::swin {
namespace {

/// timm 1.0 swin_transformer.py's registered SwinTransformer models (model_args; img_size
/// from the pretrained config's input_size).
struct TimmSwin {
  const char* name;
  int64_t embed_dim, window_size, img_size;
  std::array<int64_t, 4> depths, num_heads;
};
constexpr TimmSwin kTimmSwins[] = {
    {"swin_tiny_patch4_window7_224", 96, 7, 224, {2, 2, 6, 2}, {3, 6, 12, 24}},
    {"swin_small_patch4_window7_224", 96, 7, 224, {2, 2, 18, 2}, {3, 6, 12, 24}},
    {"swin_base_patch4_window7_224", 128, 7, 224, {2, 2, 18, 2}, {4, 8, 16, 32}},
    {"swin_base_patch4_window12_384", 128, 12, 384, {2, 2, 18, 2}, {4, 8, 16, 32}},
    {"swin_large_patch4_window7_224", 192, 7, 224, {2, 2, 18, 2}, {6, 12, 24, 48}},
    {"swin_large_patch4_window12_384", 192, 12, 384, {2, 2, 18, 2}, {6, 12, 24, 48}},
};

/// The timm.create_model arguments read (or, for the drop rates, accepted) from backbone_kwargs.
constexpr const char* kCreateModelArgs[] = {
    "out_indices",    "img_size",        "always_partition", "embed_dim", "depths",
    "num_heads",      "window_size",     "patch_size",       "mlp_ratio", "qkv_bias",
    "in_chans",       "strict_img_size", "dynamic_img_size", "drop_rate", "proj_drop_rate",
    "attn_drop_rate", "drop_path_rate"};

const TimmSwin& find_swin(const core::ConfigView& named, const char* fallback) {
  auto name = fallback ? named.get_string("backbone", fallback) : named.get_string("backbone");
  const auto tag = name.find('.');
  if (tag != std::string::npos) name.resize(tag);
  for (const auto& s : kTimmSwins)
    if (name == s.name) return s;
  std::string known;
  for (const auto& s : kTimmSwins) known += std::string(known.empty() ? "" : ", ") + s.name;
  named.fail("backbone", "timm model '" + name + "' is not supported (supported: " + known + ")");
}

}  // namespace

BackboneConfig parse_timm_backbone(const core::ConfigView& named, const char* kwargs_field,
                                   const TimmDefaults& defaults) {
  const auto& swin = find_swin(named, defaults.name);
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const bool only_create_model_args = kwargs_field != nullptr;
  const bool present = only_create_model_args && named.has(kwargs_field);
  const auto kwargs = !only_create_model_args ? named
                      : present               ? named.child(kwargs_field)
                                : core::ConfigView(kEmpty, named.file(), kwargs_field);
  if (present)
    for (const auto& item : named.raw(kwargs_field).items())
      if (std::find(std::begin(kCreateModelArgs), std::end(kCreateModelArgs), item.key()) ==
          std::end(kCreateModelArgs))
        kwargs.fail(item.key(),
                    "not a timm.create_model argument of SwinTransformer supported here");
  if (!only_create_model_args) {
    if (!kwargs.get_bool("features_only", true))
      kwargs.fail("features_only", "must be true (the backbone's feature maps)");
    if (kwargs.has("output_stride")) kwargs.fail("output_stride", "only null is supported");
  }
  if (!kwargs.get_bool("strict_img_size", true))
    kwargs.fail("strict_img_size", "only true (timm's default) is supported");
  if (kwargs.get_bool("dynamic_img_size", false))
    kwargs.fail("dynamic_img_size", "only false (timm's default) is supported");

  BackboneConfig b;
  auto& c = b.swin;
  c.timm = true;
  c.embed_dim = kwargs.get_int("embed_dim", swin.embed_dim);
  c.window_size = kwargs.get_int("window_size", swin.window_size);
  c.patch_size = kwargs.get_int("patch_size", 4);
  c.depths = kwargs.get_int_list("depths", {swin.depths.begin(), swin.depths.end()});
  c.num_heads = kwargs.get_int_list("num_heads", {swin.num_heads.begin(), swin.num_heads.end()});
  c.mlp_ratio = kwargs.get_double("mlp_ratio", 4.0);
  c.qkv_bias = kwargs.get_bool("qkv_bias", true);
  c.num_channels = kwargs.get_int("in_chans", kwargs.get_int("num_channels", 3));
  if (c.embed_dim <= 0) kwargs.fail("embed_dim", "must be positive");
  if (c.patch_size <= 0) kwargs.fail("patch_size", "must be positive");
  if (c.window_size <= 0) kwargs.fail("window_size", "must be positive");
  if (c.num_channels <= 0) kwargs.fail("in_chans", "must be positive");
  if (c.depths.empty() || c.depths.size() != c.num_heads.size())
    kwargs.fail("num_heads", "must have one entry per stage of 'depths'");
  for (size_t s = 0; s < c.depths.size(); ++s) {
    if (c.depths[s] <= 0) kwargs.fail("depths", "every stage needs at least one block");
    const int64_t dim = c.embed_dim << s;
    if (c.num_heads[s] <= 0 || dim % c.num_heads[s] != 0)
      kwargs.fail("num_heads", c10::str("stage ", s, ": ", dim, " channels not divisible by ",
                                        c.num_heads[s], " heads"));
  }
  const auto img =
      kwargs.get_int_or_list("img_size", defaults.img_size > 0 ? defaults.img_size : swin.img_size);
  if (img.empty() || img.size() > 2 || img.front() <= 0 || img.back() <= 0)
    kwargs.fail("img_size", "must be a positive int or [height, width]");
  b.required_height = img.front();
  b.required_width = img.back();
  c.image_size = img.front();
  b.always_partition = kwargs.get_bool("always_partition", defaults.always_partition);
  // timm clamps the window per axis (SwinTransformerBlock._calc_window_shift), transformers'
  // blocks by the shorter side: the same on square maps only.
  if (!b.always_partition && b.required_height != b.required_width)
    kwargs.fail("always_partition", "false needs a square img_size");

  const auto stages = static_cast<int64_t>(c.depths.size());
  int64_t previous = 0;
  for (auto i : kwargs.get_int_list("out_indices", defaults.out_indices)) {
    if (i < 0) i += stages;
    if (i < 0 || i >= stages || i + 1 <= previous)
      kwargs.fail("out_indices", c10::str("must be increasing stage indices in [0, ", stages,
                                          ") (or from the end)"));
    b.out_indices.push_back(i + 1);
    previous = i + 1;
  }
  return b;
}

}  // namespace libreyolo::models::swin
