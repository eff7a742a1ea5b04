#include "server/instance/loaded_model.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

#include "kernels/policy.h"
#include "kernels/registry.h"
#include "log/log.h"
#include "models/layers/attention.h"
#include "models/prompted.h"
#include "models/runtime/cpu_math.h"

namespace libreyolo::server {
namespace {

at::Device resolve_device(const std::string& wanted) {
  if (wanted.empty() || wanted == "auto")
    return at::hasCUDA() ? at::Device("cuda:0") : at::Device(at::kCPU);
  at::Device d(wanted);
  if (d.is_cuda() && !at::hasCUDA()) {
    throw std::runtime_error("device " + wanted + " requested but no CUDA device is available");
  }
  // "cuda" means the first device; say so in /active and the logs.
  if (d.is_cuda() && !d.has_index()) d = at::Device(at::kCUDA, 0);
  return d;
}

at::ScalarType resolve_dtype(const std::string& name) {
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

}  // namespace

std::shared_ptr<LoadedModel> load_model_version(const InstanceOptions& in,
                                                const ModelLoader& loader) {
  const std::string& name = in.name;
  const ServingConfig& serving = in.serving;
  auto m = std::make_shared<LoadedModel>();
  m->name = name;
  m->instance = in.instance;
  m->version = in.version;
  m->dir = in.dir;
  m->serving = serving;
  m->device = resolve_device(serving.device.empty() ? in.server_device : serving.device);
  m->dtype_choice =
      choose_dtype(serving.dtype, serving.dtype_origin, in.server_dtype.value,
                   in.server_dtype.origin, m->device.is_cuda(), host_cpu_bf16_flags());
  m->dtype = resolve_dtype(m->dtype_choice.dtype);
  models::LoadOptions options;
  options.device = m->device;
  options.dtype = m->dtype;
  options.name = name;
  options.instance = in.instance;
  // serving.yaml's kernel lists, checked against what the process declares and provides.
  try {
    kernels::check_names(serving.kernels.slot_allow, kernels::Registry::process_default());
  } catch (const kernels::PolicyError& e) {
    throw std::runtime_error(e.what());
  }
  options.kernel_slots = serving.kernels.allow();
  // serving.yaml `kernels.layouts` wins over the server's kernels.layouts for this model.
  options.layouts.mode = serving.kernels.layouts ? *serving.kernels.layouts : in.server_layouts;
  options.layouts.kernel_config = serving.kernel_config;
  options.quantization = serving.quantization;
  m->model = loader(in.dir, options);  // config.json first: its errors name the checkpoint
  m->processor = image::load_image_processor(in.dir);
  m->gpu_image_decode =
      choose_gpu_image_decode(in.gpu_image_decode.value, in.gpu_image_decode.origin,
                              m->device.is_cuda(), m->dtype_choice.dtype);
  if (m->gpu_image_decode.on) {
    // server.gpu_image_decode: the `image_decode` slot for this device, with serving.yaml's
    // kernel lists (the reference is always among the candidates).
    auto& registry = kernels::Registry::process_default();
    kernels::BindContext context;
    context.device = kernels::BindContext::Device::cuda;
    context.device_index = m->device.index();
    context.dtype = m->dtype_choice.dtype;
    context.model = name;
    context.instance = in.instance;
    const kernels::Filter filter = registry.filter().overridden(options.kernel_slots);
    m->image_decode = registry.bind(kernels::kImageDecode, context, &filter);
    m->image_decode_batch = registry.bind(kernels::kImageDecodeBatch, context, &filter);
    m->image_preprocess = registry.bind(kernels::kImagePreprocess, context, &filter);
    // Concurrent requests' JPEGs decoded together (DecodeBatcher): up to 64 per round, in
    // batched decodes of up to 32, two rounds at once (one's host work beside the other's device
    // work). One round at a time capped RT-DETR-R18 served at 64 clients at the rounds' pace:
    // 0.727 of forward-only against 0.779 with two and 0.782 with three, R50 0.814 / 0.818
    // (H100, 2026-12-07; docs/BENCHMARKS.md "Served JPEG").
    if (!m->image_decode_batch.empty() && gpu_preprocess_takes(*m->processor))
      m->decode_batcher = std::make_unique<DecodeBatcher>(
          gpu_decode_round(m->image_decode_batch, m->image_preprocess, *m->processor, m->dtype,
                           m->device),
          64, 2);
  }
  for (const auto& r : m->model->layouts())
    log::info(c10::str("model '", name, "': layout ", r.layout, " (", r.source, "): ", r.modules,
                       " modules, parameters ", r.params_before, " -> ", r.params_after));
  if (serving.quantization != models::quantization::Quantization::none)
    log::info("model '" + name + "': quantization " + quantization_status(*m));
  m->task = make_task_adapter(*m->model, serving);
  // The flag is chosen once here, before the warm-up and before anything could capture a graph.
  if (serving.fused_attention != kernels::FusedAttention::family_default) {
    m->fused_attention = serving.fused_attention;
    m->fused_attention_source = "serving.yaml " + serving.fused_attention_origin;
  } else if (in.server_fused_attention != kernels::FusedAttention::family_default) {
    m->fused_attention = in.server_fused_attention;
    m->fused_attention_source = "server";
  } else if (models::layers::fused_attention_by_default(m->device, m->dtype)) {
    m->fused_attention = kernels::FusedAttention::on;
    m->fused_attention_source = std::string("default for ") + m->device.str() +
                                (m->dtype == at::kHalf ? " float16" : " bfloat16") +
                                " (float32 keeps the family default)";
  }
  if (m->device.is_cpu() && models::flush_denormals_by_default(static_cast<int>(m->dtype))) {
    m->flush_denormals = true;
    log::info("model '" + name +
              "': denormals flushed to zero on its instance threads (default for " +
              c10::toString(m->dtype) + " on the CPU; float32 keeps IEEE denormals)");
  }
  if (m->fused_attention != kernels::FusedAttention::family_default) {
    const bool on = m->fused_attention == kernels::FusedAttention::on;
    m->fused_attention_changed = m->model->set_fused_attention(on);
    log::info(c10::str("model '", name, "': fused_attention ",
                       kernels::fused_attention_name(m->fused_attention), " (",
                       m->fused_attention_source, "): ", m->fused_attention_changed,
                       " attention modules changed to ", on ? "SDPA" : "the manual path"));
  }
  return m;
}

std::string quantization_status(const LoadedModel& m) {
  const auto& q = m.model->quantization();
  if (q.requested == models::quantization::Quantization::none) return "none";
  if (q.implementation.empty()) return "off: " + q.unavailable;
  return c10::str("fp8 through ", q.implementation, ": ", q.fp8.layers, " Linear layers (",
                  q.fp8.parameters, " weights), ", q.fp8.kept_shape,
                  " kept in the model's dtype (K or N not a multiple of 16)");
}

std::vector<std::string> instance_devices(const ServingConfig& serving,
                                          const std::string& server_device) {
  if (serving.instance_group.empty())
    return {serving.device.empty() ? server_device : serving.device};
  const auto gpus = static_cast<std::int64_t>(at::getNumGPUs());
  std::vector<std::string> out;
  for (const auto& g : serving.instance_group) {
    auto kind = g.kind;
    if (kind == InstanceGroup::Kind::automatic)
      kind = gpus > 0 ? InstanceGroup::Kind::gpu : InstanceGroup::Kind::cpu;
    if (kind == InstanceGroup::Kind::cpu) {
      for (std::int64_t i = 0; i < g.count; ++i) out.push_back("cpu");
      continue;
    }
    std::string list;
    for (auto i : g.gpus) list += (list.empty() ? "" : ", ") + std::to_string(i);
    const std::string what = g.origin + ": instance_group: KIND_GPU gpus [" + list + "]: ";
    if (gpus == 0) throw std::runtime_error(what + "no CUDA device is visible");
    std::vector<std::int64_t> indices = g.gpus;
    if (indices.empty())
      for (std::int64_t i = 0; i < gpus; ++i) indices.push_back(i);
    for (auto i : indices) {
      if (i >= gpus)
        throw std::runtime_error(what + "GPU " + std::to_string(i) + " does not exist (" +
                                 std::to_string(gpus) + " CUDA device" + (gpus == 1 ? "" : "s") +
                                 " visible)");
    }
    for (auto i : indices)
      for (std::int64_t c = 0; c < g.count; ++c) out.push_back("cuda:" + std::to_string(i));
  }
  return out;
}

void warm_up(const LoadedModel& model) {
  const auto& c = model.processor->config();
  // The processor's output size: the crop's when it center-crops (DeiT), else the fixed resize.
  int64_t h = c.do_center_crop ? c.crop_height : c.height;
  int64_t w = c.do_center_crop ? c.crop_width : c.width;
  if (h <= 0 || w <= 0) {
    const auto hw = model.processor->output_size(480, 640);
    h = hw.first;
    w = hw.second;
  }
  at::InferenceMode guard;
  auto pixels =
      at::zeros({1, 3, h, w}, at::TensorOptions().dtype(model.dtype).device(model.device));
  at::Tensor mask;
  if (c.do_pad)
    mask = at::ones({1, h, w}, at::TensorOptions().dtype(at::kLong).device(model.device));
  // An open-vocabulary detector needs text: one label.
  const auto* prompted = models::prompted_detector(*model.model);
  auto out = prompted ? prompted->forward_prompted(pixels, prompted->encode_labels({{"a photo"}}))
                      : model.model->forward(pixels, mask);
  (void)out.logits.sum().item<float>();  // synchronise (CUDA)
}

void capture_cuda_graphs(LoadedModel& m) {
  if (!m.serving.cuda_graphs) return;
  const auto& c = m.processor->config();
  std::string why;
  const int64_t h = c.do_center_crop ? c.crop_height : c.height;  // as warm_up
  const int64_t w = c.do_center_crop ? c.crop_width : c.width;
  if (!m.device.is_cuda())
    why = "the model runs on " + m.device.str();
  else if (models::prompted_detector(*m.model))
    why = "a text-prompted model (its forward takes the request's labels)";
  else if (h <= 0 || w <= 0 || c.do_pad)
    why = "the processor has no fixed input size";
  if (!why.empty()) {
    m.cuda_graphs_status = "off: " + why;
    log::info("model '" + m.name + "': cuda_graphs ignored (" + why + ")");
    return;
  }
  try {
    const auto sizes = models::CudaGraphRunner::default_batch_sizes(m.serving.max_batch_size);
    m.graphs = std::make_unique<models::CudaGraphRunner>(*m.model, sizes, h, w, m.dtype, m.device);
    std::string list;
    for (auto b : m.graphs->batch_sizes()) list += (list.empty() ? "" : ",") + std::to_string(b);
    m.cuda_graphs_status = "on: batch sizes " + list;
    log::info("model '" + m.name + "': CUDA graphs captured for batch sizes " + list);
  } catch (const std::exception& e) {
    m.graphs.reset();
    m.cuda_graphs_status = std::string("failed: ") + e.what();
    log::warn("model '" + m.name + "': " + e.what() + "; running eagerly");
  }
}

}  // namespace libreyolo::server
