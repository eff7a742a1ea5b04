// Loads a checkpoint folder through the family that config.json `model_type` names in the
// family registry (models/registry/family.h), then applies the layouts and binds the kernels.
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/core/config.h"
#include "models/layouts/layouts.h"
#include "models/model.h"
#include "models/registry/family.h"
#include "models/runtime/cpu_math.h"

namespace libreyolo::models {

namespace {

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

void describe_model(ModelDescription& d, const Model& model, const Family& family,
                    const std::string& file) {
  d.model_type = model.model_type();
  d.task = model.task();
  if (d.num_labels < 0 && !model.id2label().empty())
    d.num_labels = static_cast<int64_t>(model.id2label().size());
  if (d.task == Task::image_classification) {
    d.num_queries = -1;
    return;
  }
  if (!family.head)
    throw std::runtime_error(file +
                             ": model_type: no object-detection post-processing for model_type \"" +
                             d.model_type + "\"");
  d.head = *family.head;
}

/// LoadOptions::quantization fp8: binds `fp8_gemm` for the model (kept in its BoundKernels, so
/// the registry's report lists the binding and its reasons) and quantises its targets when an
/// implementation can serve it.
QuantizationReport quantize(Model& model, kernels::Fp8GemmHandle& handle,
                            kernels::Registry& registry, const kernels::BindContext& context,
                            const kernels::Filter& filter) {
  QuantizationReport r;
  r.requested = quantization::Quantization::fp8;
  handle = registry.bind(kernels::kFp8Gemm, context, &filter);
  for (const auto& b : registry.bindings()) {
    if (b.model != context.model || b.instance != context.instance || b.slot != "fp8_gemm")
      continue;
    for (const auto& c : b.candidates) {
      if (!c.eligible)
        r.unavailable += (r.unavailable.empty() ? "" : "; ") + c.name + ": " + c.reason;
      else if (r.implementation.empty())
        r.implementation = c.name;  // bound candidates come first, in call order
    }
  }
  // Served: the others' reasons are the registry report's business, not the model's status.
  if (!handle.empty())
    r.unavailable.clear();
  else if (r.unavailable.empty())
    r.unavailable =
        "no fp8_gemm implementation in this process (scaled_mm comes with the cuda provider)";
  r.fp8 = quantization::quantize_fp8(model.root(), handle);
  return r;
}

std::string folder_name(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const auto slash = d.rfind('/');
  return slash == std::string::npos ? d : d.substr(slash + 1);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& requested) {
  // Before this process's first forward (models/runtime/cpu_math.h: MKL VML's lazy start, made
  // on two threads at once, gave one half of a tensor a less accurate tanh / erf). Once per
  // process; here because every program that runs a model loads it through this function.
  initialise_cpu_math();
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
  const Family& family = FamilyRegistry::builtin().require(view.get_string("model_type"), view);
  auto model = family.load(dir, config, options);
  describe_model(description, *model, family, file);
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
  const auto filter = registry.filter().overridden(options.kernel_slots);
  model->bind_kernels(registry, context, filter);
  if (options.quantization == quantization::Quantization::fp8) {
    try {
      model->quantization_ = quantize(*model, model->kernels_.fp8_gemm, registry, context, filter);
    } catch (const c10::Error& e) {
      throw std::runtime_error(dir + ": quantization fp8: " + e.what_without_backtrace());
    }
  }
  return model;
}

}  // namespace libreyolo::models
