// Per-model serving settings: <repo>/<model>/serving.yaml (DESIGN.md "Model repository").
// No torch in this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/policy.h"
#include "models/layouts/options.h"
#include "models/quantization/quantization.h"

namespace libreyolo::server {

/// One entry of `instance_group:` (Triton's ModelInstanceGroup): `count` instances on each GPU
/// of `gpus` (KIND_GPU; `gpus` empty: every visible GPU, as Triton), or `count` instances on the
/// CPU (KIND_CPU). KIND_AUTO (the default kind): KIND_GPU when a CUDA device is visible, else
/// KIND_CPU.
struct InstanceGroup {
  enum class Kind { automatic, gpu, cpu };
  Kind kind = Kind::automatic;
  std::int64_t count = 1;          ///< 1 to 64 instances (per GPU for KIND_GPU)
  std::vector<std::int64_t> gpus;  ///< CUDA device indices (KIND_GPU only), distinct
  std::string origin;              ///< "FILE:LINE:COLUMN" of the entry
};

/// "KIND_AUTO", "KIND_GPU", "KIND_CPU".
const char* instance_kind_name(InstanceGroup::Kind kind);

/// Every key optional. Batching knobs mirror Triton's ModelDynamicBatching / ModelQueuePolicy.
struct ServingConfig {
  std::string device;  ///< "" = the server's `device`; else cpu | cuda | cuda:N
  /// float32 | float16 | bfloat16; "" (unset): the server's `dtype`, else the device rule
  /// (server/instance/dtype_policy.h: bfloat16 on a CPU with AVX-512 BF16 or AMX, else float32).
  std::string dtype;
  std::string dtype_origin;         ///< "FILE:LINE:COLUMN" of the key; "" when not set
  std::int64_t max_batch_size = 8;  ///< images per forward
  std::uint64_t max_queue_delay_microseconds = 0;  ///< how long a batch may wait to grow
  /// After answering k requests, an instance waits at most this fraction of their forward's time
  /// for k new requests before running a smaller batch (server/scheduler/dynamic_batcher.h, the
  /// refill wait); 0 to 1, 0 is Triton's behaviour (no such wait).
  double refill_wait_fraction = 0.1;
  std::uint32_t max_queue_size = 64;  ///< queued requests; more -> RESOURCE_EXHAUSTED
  std::uint64_t default_timeout_microseconds =
      0;                   ///< queue deadline when the client sets none; 0: none
  double threshold = 0.5;  ///< default score threshold (request parameter `threshold` wins)
  std::int64_t top_k = 0;  ///< default candidates before thresholding; 0: family default
  bool warmup = true;      ///< run one forward before declaring the model ready
  /// `fused_attention: default | on | off`: SDPA (on) or the manual attention math (off) in
  /// every attention module, applied with models::Model::set_fused_attention after loading.
  /// family_default ("default"): the server's `kernels.fused_attention` decides.
  kernels::FusedAttention fused_attention = kernels::FusedAttention::family_default;
  std::string fused_attention_origin;  ///< "FILE:LINE:COLUMN" of the key; "" when not set
  /// `cuda_graphs: on`: capture the forward as CUDA graphs at batch sizes 1, 2, 4, the
  /// multiples of 8 and max_batch_size after loading (CudaGraphRunner::default_batch_sizes), and
  /// replay them (a batch is padded to the next captured size). Only for CUDA models with a fixed
  /// input size (RT-DETR, ViT, Swin); elsewhere ignored with a log line. A capture failure logs a
  /// warning and keeps eager execution.
  bool cuda_graphs = false;
  /// `prompt_cache_mb`: the budget of each instance's prompt cache (open-vocabulary families
  /// whose text is encoded apart from the image, models::PromptedDetector::caches_text: OWL's
  /// labels, Grounding DINO's captions, OmDet-Turbo's classes and task sentences; an LRU by
  /// piece, server/instance/prompt_cache.h), MiB; 0 turns it off.
  std::int64_t prompt_cache_mb = 64;
  /// `quantization: none | fp8`: fp8 runs the Linear layers of the model's transformer blocks
  /// through the `fp8_gemm` slot with FP8 weights quantised at load (models/quantization/fp8.h;
  /// CUDA bfloat16 models on GPUs with FP8 tensor cores, elsewhere the model stays as it is and
  /// /active says why). Off by default: FP8 changes the numbers.
  models::quantization::Quantization quantization = models::quantization::Quantization::none;
  std::string quantization_origin;  ///< "FILE:LINE:COLUMN" of the key; "" when not set
  /// `kernels: {slots: {ms_deform_attn: {allow: [reference]}}, layouts: off}`: this model's
  /// kernel policy, overriding the server's for the slots it names (the names are checked
  /// against the process registry at load: an unknown slot or implementation fails the load).
  kernels::ModelKernelPolicy kernels;
  /// `kernel_config:` (models/layouts/kernel_config.h): which layout replaces which transformers
  /// class of this model, in file order; validated here, applied by load_model.
  std::vector<models::layouts::KernelConfigEntry> kernel_config;
  /// `instance_group: [{count: 2, kind: KIND_GPU, gpus: [0, 1]}, {count: 1, kind: KIND_CPU}]`
  /// (Triton's form): the model's instances, each with its own weights, kernel handles, stream
  /// and CUDA graphs, fed by the one dynamic batcher. Empty: one instance on `device`.
  std::vector<InstanceGroup> instance_group;
};

/// Reads `file` when it exists (else the defaults). Throws std::runtime_error naming
/// file:line:column for unknown keys and bad values.
ServingConfig load_serving_config(const std::string& file);

/// Parses YAML text read from `file` (tests).
ServingConfig parse_serving_config(const std::string& yaml_text, const std::string& file);

}  // namespace libreyolo::server
