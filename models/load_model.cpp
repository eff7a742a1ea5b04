// Dispatches config.json `model_type` to the families' loaders. A family exposes
//   std::unique_ptr<Model> load_<family>(const std::string& dir, const nlohmann::json& config,
//                                        const LoadOptions& options)
// in models/<family>/<family>.h; families that are not in the tree yet are skipped through
// __has_include so that the tree always compiles.
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/core/config.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/rtdetr/rtdetr.h"

#if __has_include("models/deformable_detr/deformable_detr.h")
#include "models/deformable_detr/deformable_detr.h"
#define LIBREYOLO_HAS_DEFORMABLE_DETR 1
#endif
#if __has_include("models/dfine/dfine.h")
#include "models/dfine/dfine.h"
#define LIBREYOLO_HAS_DFINE 1
#endif
#if __has_include("models/deimv2/deimv2.h")
#include "models/deimv2/deimv2.h"
#define LIBREYOLO_HAS_DEIMV2 1
#endif
#if __has_include("models/vit/vit.h")
#include "models/vit/vit.h"
#define LIBREYOLO_HAS_VIT 1
#endif
#if __has_include("models/lw_detr/lw_detr.h")
#include "models/lw_detr/lw_detr.h"
#define LIBREYOLO_HAS_LW_DETR 1
#endif
#if __has_include("models/rf_detr/rf_detr.h")
#include "models/rf_detr/rf_detr.h"
#define LIBREYOLO_HAS_RF_DETR 1
#endif
#if __has_include("models/deit/deit.h")
#include "models/deit/deit.h"
#define LIBREYOLO_HAS_DEIT 1
#endif
#if __has_include("models/swin/swin.h")
#include "models/swin/swin.h"
#define LIBREYOLO_HAS_SWIN 1
#endif

namespace libreyolo::models {

namespace {

std::unique_ptr<Model> load_family(const std::string& dir, const nlohmann::json& config,
                                   const core::ConfigView& view, const LoadOptions& options) {
  const std::string type = view.get_string("model_type");
  if (type == "rt_detr" || type == "rt_detr_v2") return load_rtdetr(dir, config, options);
#ifdef LIBREYOLO_HAS_DEFORMABLE_DETR
  if (type == "deformable_detr") return load_deformable_detr(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_DFINE
  if (type == "d_fine") return load_dfine(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_DEIMV2
  if (type == "deimv2") return load_deimv2(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_LW_DETR
  if (type == "lw_detr") return load_lw_detr(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_RF_DETR
  if (type == "rf_detr") return load_rf_detr(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_VIT
  if (type == "vit") return load_vit(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_DEIT
  if (type == "deit") return load_deit(dir, config, options);
#endif
#ifdef LIBREYOLO_HAS_SWIN
  if (type == "swin") return load_swin(dir, config, options);
#endif
  view.fail("model_type", "unsupported model type \"" + type + "\"");
}

std::string dtype_name(at::ScalarType dtype) {
  if (dtype == at::kHalf) return "float16";
  if (dtype == at::kBFloat16) return "bfloat16";
  return "float32";
}

/// config[key] as T, or `fallback` when absent or null; another type is an error naming the
/// file and the key (nlohmann's own type_error names neither).
template <class T>
T field(const nlohmann::json& config, const std::string& file, const char* key, T fallback) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const std::exception& e) {
    throw std::runtime_error(file + ": field '" + key + "': " + e.what());
  }
}

/// What the server and the tools need to know of the checkpoint, read here once: the fields of
/// config.json first (a mistyped one fails before any weight is read, naming the file), then
/// what the loaded family says (task, head).
ModelDescription describe_config(const nlohmann::json& config, const std::string& file) {
  ModelDescription d;
  const auto labels = config.find("id2label");
  if (labels != config.end() && labels->is_object())
    d.num_labels = static_cast<int64_t>(labels->size());
  d.num_queries = field<int64_t>(config, file, "num_queries", int64_t{-1});
  d.use_focal_loss = field<bool>(config, file, "use_focal_loss", true);
  return d;
}

void describe_model(ModelDescription& d, const Model& model, const std::string& file) {
  d.model_type = model.model_type();
  d.task = model.task();
  if (d.num_labels < 0 && !model.id2label().empty())
    d.num_labels = static_cast<int64_t>(model.id2label().size());
  if (d.task == Task::image_classification) {
    d.num_queries = -1;
    return;
  }
  try {
    d.head = image::detection_head_for(d.model_type);
  } catch (const std::exception& e) {
    throw std::runtime_error(file + ": model_type: " + e.what());
  }
}

std::string folder_name(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const auto slash = d.rfind('/');
  return slash == std::string::npos ? d : d.substr(slash + 1);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& requested) {
  // "cuda" means the current CUDA device. Models compare an input's device exactly (cuda:0 !=
  // cuda), so resolve the index once here: what a tensor created on "cuda" reports.
  LoadOptions options = requested;
  if (options.device.is_cuda() && !options.device.has_index())
    options.device = at::empty({0}, at::TensorOptions().device(options.device)).device();
  const std::string file = dir + "/config.json";
  const nlohmann::json config = core::read_json_file(file);
  const core::ConfigView view(config, file);
  if (options.dtype != at::kFloat && options.dtype != at::kHalf && options.dtype != at::kBFloat16)
    throw std::runtime_error(dir + ": unsupported load dtype " +
                             std::string(c10::toString(options.dtype)) +
                             " (supported: float32, float16, bfloat16)");
  ModelDescription description = describe_config(config, file);
  auto model = load_family(dir, config, view, options);
  describe_model(description, *model, file);
  model->description_ = std::move(description);
  // Layouts rewrite the loaded tensors once (models/layouts/layouts.h); off leaves the modules
  // exactly as loaded. Before binding: a folded module binds the slot its new forward calls.
  model->layout_reports_ = layouts::apply_layouts(
      model->root(),
      layouts::LayoutContext{model->model_type(), options.device, options.dtype,
                             at::globalContext().allowTF32CuDNN()},
      options.layouts);
  // Bind (kernelize): every slot resolved once for this model's device, dtype and policy.
  kernels::Registry& registry =
      options.registry ? *options.registry : kernels::Registry::process_default();
  kernels::BindContext context;
  context.device = options.device.is_cuda()  ? kernels::BindContext::Device::cuda
                   : options.device.is_cpu() ? kernels::BindContext::Device::cpu
                                             : kernels::BindContext::Device::other;
  context.device_index = options.device.has_index() ? options.device.index() : -1;
  context.dtype = dtype_name(options.dtype);
  context.model = options.name.empty() ? folder_name(dir) : options.name;
  context.instance = options.instance;
  model->bind_kernels(registry, context, registry.filter().overridden(options.kernel_slots));
  return model;
}

}  // namespace libreyolo::models
