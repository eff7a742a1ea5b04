// One registration record per model family, collected without central edits (after PyTorch's
// TORCH_LIBRARY and transformers' auto mappings): each family's .cpp registers a Family (the
// config.json model_types it loads, its loader, tasks, detection post-processing, fused-attention
// default and layouts entries) through a FamilyRegistrar, and load_model, the layout catalog and
// the layouts' defaults read FamilyRegistry::builtin(). Adding a family touches its own folder,
// its fixtures and the docs table only (docs/DESIGN.md "Model families").
//
// No torch here: the layout catalog (models/layouts/catalog.h, torch-free for the serving.yaml
// parser) reads the records too. Model, LoadOptions, Task and image::DetectionHead are declared,
// not defined: a family's .cpp includes models/model.h.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace libreyolo::image {
enum class DetectionHead;
}

namespace libreyolo::models {

class Model;
struct LoadOptions;
enum class Task;

namespace core {
class ConfigView;
}

/// A family's loader: `dir`/model.safetensors for the parsed config.json `config`. Throws
/// std::runtime_error (core::ConfigError / core::CheckpointError) naming the file and the field
/// or tensor key.
using FamilyLoader = std::unique_ptr<Model> (*)(const std::string& dir,
                                                const nlohmann::json& config,
                                                const LoadOptions& options);

/// The transformers class of a module that a layout may replace in one family. A family's rules
/// are tried in order; the first whose layout, model_type and path match names the module
/// (layouts::upstream_classes); no match: the layout leaves the module alone.
struct LayoutClassRule {
  std::string layout;                ///< "batchnorm_fold", "repvgg", "avgpool_fold", "qkv_concat"
  std::vector<std::string> classes;  ///< the class itself first, then other spellings
  std::string model_type;            ///< "" = every model_type of the family
  /// Whether the module at dotted `path` is this class; null = every path.
  std::function<bool(const std::string& path)> where;
};

/// True when dotted `path` has `segment` as one whole part ("model.backbone.x" has "backbone").
bool path_has_segment(const std::string& path, const std::string& segment);
/// A LayoutClassRule::where: path_has_segment(path, `segment`).
std::function<bool(const std::string& path)> path_with(std::string segment);

/// A model family's registration record, written in the family's .cpp as
///   Family{"dfine", {"d_fine"}, /*order=*/30, load_dfine}
///       .predicts({Task::object_detection}, image::DetectionHead::rt_detr)
///       .fused_attention(kFusedAttentionDefault)
///       .layouts({{"repvgg", {"DFineRepVggBlock"}}, ...}, {"repvgg", ...})
struct Family {
  Family() = default;
  /// The identity: folder name, model_types, listing order and loader.
  Family(std::string name, std::vector<std::string> model_types, int order, FamilyLoader load);
  /// Sets `tasks` to `what` and `head` to `post_processing` (detectors; none for classifiers).
  Family&& predicts(std::vector<Task> what,
                    std::optional<image::DetectionHead> post_processing = std::nullopt) &&;
  /// Sets `fused_attention_default`.
  Family&& fused_attention(bool by_default) &&;
  /// Sets `layout_classes`, `default_layouts` and `reduced_precision_layouts`.
  Family&& layouts(std::vector<LayoutClassRule> classes, std::vector<std::string> defaults,
                   std::vector<std::string> reduced_precision_defaults = {}) &&;
  /// Sets `pixel_mask`: the family's forward reads pixel_mask.
  Family&& takes_pixel_mask() &&;

  std::string name;                      ///< the family's folder under models/ ("rtdetr")
  std::vector<std::string> model_types;  ///< the config.json model_types it loads
  /// Where the family is listed (FamilyRegistry::all(), hence the order of the layout catalog's
  /// class lists quoted in serving.yaml errors): ascending, ties by name.
  int order = 0;
  FamilyLoader load = nullptr;
  std::vector<Task> tasks;  ///< what its models predict (Model::task() is one of them)
  /// Detectors: transformers' post_process_object_detection of the family's processor.
  std::optional<image::DetectionHead> head;
  /// The `fused_attn` flag its attention modules load with (docs/DESIGN.md "Fused attention":
  /// SDPA only where it is byte-exact with the manual math on the family's fixtures;
  /// tests/parity/fused_attention_policy_test.cpp measures it).
  bool fused_attention_default = false;
  std::vector<LayoutClassRule> layout_classes;  ///< what each layout replaces in it
  /// The layouts on under `kernels.layouts: default` (layouts::on_by_default), decided by the
  /// parity gate (tests/parity/layouts_parity_test.cpp).
  std::vector<std::string> default_layouts;
  /// Layouts on under `kernels.layouts: default` only in bfloat16 / float16, where no float32
  /// parity bar applies: those whose float32 drift the parity gate does not take for every dtype
  /// (PP-DocLayout: folding moves the reading-order logits by ~1e-4, the bar itself).
  std::vector<std::string> reduced_precision_layouts;
  /// Its forward reads pixel_mask (B, H, W) and keeps the padding out of what the image's
  /// features attend to (transformers' forward takes `pixel_mask`: DETR and its lineage,
  /// Deformable DETR, LW-DETR, RF-DETR). An image padded into a larger batch then keeps its
  /// outputs, so the server batches requests of any size together (server/scheduler). False: the
  /// padding is encoded like pixels (YOLOS, whose forward has no pixel_mask), or the processor
  /// never pads; requests share a forward only with requests of their own preprocessed size.
  bool pixel_mask = false;
};

/// The families by model_type.
class FamilyRegistry {
 public:
  /// The families compiled into libreyolo_models, each added once by its FamilyRegistrar when
  /// the library loads. A function-local static: usable from any static initialiser.
  static FamilyRegistry& builtin();

  /// Adds `family`. Throws std::invalid_argument "model_type \"<t>\" is registered twice
  /// (families <a> and <b>)" when one of its model_types is taken, and "family \"<name>\": <what>"
  /// for a record without a name, a model_type or a loader. Not thread-safe: families are added
  /// when the library loads, before any lookup.
  void add(Family family);
  /// The family that loads `model_type`, or nullptr.
  const Family* find(const std::string& model_type) const;
  /// find(model_type); none: throws core::ConfigError through `config`, "<config.json>: field
  /// 'model_type': unsupported model type \"<model_type>\"".
  const Family& require(const std::string& model_type, const core::ConfigView& config) const;
  /// Every family, by Family::order then name.
  std::vector<const Family*> all() const;

 private:
  std::vector<std::unique_ptr<const Family>> families_;  // stable addresses
};

/// Adds a family to FamilyRegistry::builtin() from a namespace-scope static in the family's .cpp:
///   const FamilyRegistrar registered{Family{...}.predicts(...)...};
/// A record that add() refuses terminates the process as the library loads, naming the problem.
struct FamilyRegistrar {
  explicit FamilyRegistrar(Family family);
};

}  // namespace libreyolo::models
