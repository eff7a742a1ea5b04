// One served model version on the torch side: the checkpoint, its image processor, its task
// adapter and its serving settings. What the model is (task, labels, queries, post-processing)
// comes from the model itself (models::Model::description()); nothing here reads config.json.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>

#include "kernels/image/image_decode.h"
#include "kernels/image/image_preprocess.h"
#include "kernels/policy.h"
#include "models/image/processor.h"
#include "models/model.h"
#include "models/runtime/cuda_graph_runner.h"
#include "server/config/serving_config.h"
#include "server/instance/decode_batcher.h"
#include "server/instance/dtype_policy.h"
#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

/// How checkpoints are loaded: models::load_model in the daemon; tests inject fakes.
using ModelLoader = std::function<std::unique_ptr<models::Model>(const std::string& dir,
                                                                 const models::LoadOptions&)>;

struct LoadedModel {
  std::string name;
  std::string version;
  /// "<model>_<i>" when the model has several instances (instance_group), else "".
  std::string instance;
  std::string dir;  ///< <repo>/<model>/<version>
  ServingConfig serving;
  std::unique_ptr<models::Model> model;
  std::unique_ptr<image::ImageProcessor> processor;
  /// The `image_decode` slot bound for this model's device (server.gpu_image_decode on and the
  /// model on CUDA); empty otherwise: images are decoded on the CPU pool as before.
  kernels::ImageDecodeHandle image_decode;
  /// Its batch variant, bound with it: the JPEGs of concurrent requests decoded together
  /// (decode_batcher below; what it leaves goes through image_decode).
  kernels::ImageDecodeBatchHandle image_decode_batch;
  /// The `image_preprocess` slot, bound with them: a CUDA image resized, rescaled, normalised and
  /// padded into its pixel_values in the model's dtype by one kernel
  /// (models/image/preprocess_slot.h); empty: the image processor's ATen ops.
  kernels::ImagePreprocessHandle image_preprocess;
  /// With image_decode_batch bound and a processor the image_preprocess kernel takes
  /// (gpu_preprocess_takes): the requests' JPEGs decoded and preprocessed in rounds across
  /// requests (decode_batcher.h); null otherwise.
  std::unique_ptr<DecodeBatcher> decode_batcher;
  /// The task's request/response rules (chosen from model->description().task).
  std::unique_ptr<TaskAdapter> task;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  /// `dtype` by name ("bfloat16") and why (server/instance/dtype_policy.h choose_dtype):
  /// "serving.yaml FILE:L:C", "server dtype FILE:L:C", "cpu has amx_bf16", "default on cuda".
  DtypeChoice dtype_choice;
  /// The effective fused-attention setting: serving.yaml `fused_attention` unless `default`,
  /// then the server's `kernels.fused_attention`, then the device rule
  /// (models::layers::fused_attention_by_default: on for CUDA and CPU float16/bfloat16);
  /// family_default leaves the flags as loaded.
  kernels::FusedAttention fused_attention = kernels::FusedAttention::family_default;
  /// Where it came from: "serving.yaml" (with FILE:LINE:COLUMN), "server"
  /// (kernels.fused_attention), "default for cuda:0 bfloat16 (...)" (the device rule), or
  /// "family default".
  std::string fused_attention_source = "family default";
  /// server.gpu_image_decode as resolved for this instance's device and dtype, and why.
  GpuImageDecodeChoice gpu_image_decode;
  /// Attention modules whose flag set_fused_attention changed (0 for family_default).
  int fused_attention_changed = 0;
  /// Whether its instance threads run with denormals flushed to zero (x86 FTZ + DAZ,
  /// models/runtime/cpu_math.h): CPU bfloat16 / float16 models
  /// (models::flush_denormals_by_default).
  bool flush_denormals = false;
  /// Captured CUDA graphs (serving.yaml `cuda_graphs: on`), used by its instance worker only.
  std::unique_ptr<models::CudaGraphRunner> graphs;
  /// What /active reports: "off", "on: batch sizes 1,2,4,8", "off: <why>", "failed: <why>".
  std::string cuda_graphs_status = "off";
};

/// What serving.yaml `quantization` did to `m` (models::Model::quantization()): "none",
/// "off: <why no fp8_gemm implementation serves the model>", or "fp8 through <implementation>:
/// N Linear layers (W weights), K kept in the model's dtype (...)".
std::string quantization_status(const LoadedModel& m);

/// What loading one instance of a model version takes, built once per instance by the life
/// cycle: the version, its serving.yaml, and the server-wide settings serving.yaml may override.
struct InstanceOptions {
  std::string name;     ///< the model's name
  std::string version;  ///< its version folder
  std::string dir;      ///< <repo>/<model>/<version>
  ServingConfig serving;
  /// server.device: "auto" | "cpu" | "cuda" | "cuda:N" (serving.device wins when set).
  std::string server_device;
  /// The server's kernels.fused_attention (serving.yaml fused_attention wins unless `default`).
  kernels::FusedAttention server_fused_attention = kernels::FusedAttention::family_default;
  /// The server's server.gpu_image_decode ("auto" | "on" | "off", its origin): whether a CUDA
  /// model binds the `image_decode` slots (choose_gpu_image_decode). The daemon always passes
  /// its setting (default auto, ModelLifecycle::bring_up); "off" here keeps instances built
  /// directly by tests on the CPU decoder unless they ask.
  kernels::Setting<std::string> gpu_image_decode{"off"};
  /// The server's kernels.layouts / LIBREYOLO_LAYOUTS (serving.yaml kernels.layouts wins).
  kernels::Setting<kernels::LayoutMode> server_layouts = {};
  /// "" for a model of one instance, else "<model>_<i>" (its kernel handles are bound and
  /// reported under that name).
  std::string instance;
  /// The top-level `dtype`: auto | float32 | float16 | bfloat16 (serving.dtype wins when set;
  /// auto: the device rule of server/instance/dtype_policy.h).
  kernels::Setting<std::string> server_dtype{"auto"};
};

/// Loads options.dir (config.json, model.safetensors, preprocessor_config.json) with its
/// serving.yaml on its device in the dtype choose_dtype picks (serving.dtype, the server's
/// dtype, the device rule), then applies the effective fused-attention setting
/// (serving.fused_attention, else the server's, else the device rule of
/// models::layers::fused_attention_by_default): on/off call
/// models::Model::set_fused_attention(true/false) and log how many modules changed. Layouts:
/// the server's with serving.kernel_config, as one models::LoadOptions::layouts applied by the
/// loader (models::load_model); each applied layout is logged. Every task make_task_adapter
/// serves. Throws std::runtime_error naming the file/field.
std::shared_ptr<LoadedModel> load_model_version(const InstanceOptions& options,
                                                const ModelLoader& loader);

/// The devices of a model's instances: serving.instance_group expanded as Triton does (`count`
/// instances on each GPU of `gpus`, every visible GPU when `gpus` is empty; `count` CPU
/// instances for KIND_CPU; KIND_AUTO is KIND_GPU when a CUDA device is visible), else one
/// instance on serving.device, else on `server_device`. Throws std::runtime_error naming the
/// entry ("FILE:LINE:COLUMN: instance_group: KIND_GPU gpus [3]: GPU 3 does not exist (1 CUDA
/// device visible)").
std::vector<std::string> instance_devices(const ServingConfig& serving,
                                          const std::string& server_device);

/// One forward on zeros at the processor's output size (the warm-up). Throws on failure.
void warm_up(const LoadedModel& model);

/// Captures `model.graphs` when serving.cuda_graphs is on and the model can use them (CUDA
/// device, fixed processor height/width, no padding mask); sets cuda_graphs_status. Never
/// throws for a capture failure: it is logged and the model stays eager.
void capture_cuda_graphs(LoadedModel& model);

}  // namespace libreyolo::server
