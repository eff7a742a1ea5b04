// The daemon's configuration: config/server.yaml (DESIGN.md "Configuration file"), then
// command-line flags, with the source of every value (default, file:line, flag, environment).
// No torch in this header.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/policy.h"
#include "server/security/access_policy.h"
#include "server/security/tls.h"

namespace libreyolo::server {

using kernels::Setting;
using kernels::Source;

/// A configuration error; what() starts with "FILE:LINE:COLUMN:" when it comes from a file.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Effective configuration. Every key is optional; these are the defaults.
struct ServerConfig {
  std::string file;  ///< the configuration file read ("" when none)

  // server:
  Setting<std::string> grpc_address{"0.0.0.0:8001"};
  Setting<std::string> http_address{"0.0.0.0:8000"};  ///< "" or "off": no HTTP port
  Setting<double> drain_seconds{10.0};                ///< readiness NOT_SERVING -> stop accepting
  /// gRPC receive/send limit and HTTP request body limit, bytes.
  Setting<std::int64_t> max_message_bytes{67108864};
  Setting<std::int64_t> max_images_per_request{64};      ///< images (batch N) per ModelInfer
  Setting<std::int64_t> max_pixels_per_image{40000000};  ///< width*height, checked from the header
  /// CPU pool for decoding; 0: one per core of the CPU budget (server/core/cpu_budget.h).
  Setting<std::int64_t> preprocess_threads{0};
  /// Intra-op threads of every CPU forward (at::set_num_threads); 0: the CPU budget's cores
  /// (affinity capped by the cgroup quota), or OMP_NUM_THREADS when that is set.
  Setting<std::int64_t> intra_op_threads{0};
  /// gRPC handler threads, pollers included (grpc::ResourceQuota::SetMaxThreads): calls beyond
  /// are answered RESOURCE_EXHAUSTED at once instead of each holding a thread and its request.
  /// 2 to 4096.
  Setting<std::int64_t> max_concurrent_rpcs{256};
  /// HTTP worker threads (server/http/http_server.h HttpOptions::threads): each serves one
  /// connection at a time with an 8 MiB stack; up to 64 more connections wait, beyond that they
  /// are answered 503 at once. 2 to 1024.
  Setting<std::int64_t> http_threads{32};
  Setting<std::string> model_control{"none"};  ///< none | explicit (load/unload RPCs)
  /// model_control explicit: the models loaded at start-up (Triton's --load-model; "*": all).
  /// Empty: none, the repository is only scanned. Ignored with model_control none (all load).
  Setting<std::vector<std::string>> load_models;
  /// Triton's --strict-readiness: true, ready only when every model (but those unloaded on
  /// purpose) is READY; false, ready once the start-up finished whatever the models' states.
  Setting<bool> strict_readiness{true};
  /// auto | on | off: decode JPEGs for models on a CUDA device through the `image_decode` slot
  /// straight onto that device (nvJPEG, kernels/image/image_decode.h) and resize / normalise
  /// them there (the `image_preprocess` slot); images the GPU decoder declines take the CPU
  /// path. auto: on for CUDA models in float16 / bfloat16, off for float32 ones, whose
  /// preprocessing stays the reference's to the byte (server/instance/dtype_policy.h
  /// choose_gpu_image_decode). YAML true / false read as on / off.
  Setting<std::string> gpu_image_decode{"auto"};
  Setting<std::string> log_level{"info"};  ///< debug | info | warn | error
  /// server.tls: TLS on both ports when its cert_file is set (paths relative to the file,
  /// stored absolute). Plain text otherwise.
  Setting<security::TlsFiles> tls;
  /// server.restricted_apis: how each API group is let in (Triton's restricted protocols);
  /// default: shared-memory loopback-only, the rest open.
  Setting<security::AccessRules> restricted_apis;

  Setting<std::string> model_repository{"./examples/model_repository"};
  Setting<std::string> device{"auto"};  ///< auto | cpu | cuda | cuda:N
  /// auto | float32 | float16 | bfloat16: the dtype of every model whose serving.yaml leaves
  /// `dtype` unset. auto: float32 on CUDA; on the CPU bfloat16 where it has AVX-512 BF16 or AMX,
  /// else float32 (server/instance/dtype_policy.h).
  Setting<std::string> dtype{"auto"};
  /// TensorFloat-32 on CUDA: `default` keeps PyTorch's defaults (cuDNN convolutions may use TF32,
  /// matrix multiplications do not), `on` allows both, `off` neither (float32 results equal to the
  /// CPU reference within 1e-4, and slower: docs/BENCHMARKS.md).
  Setting<std::string> tf32{"default"};
  /// PyTorch's torch.backends.cudnn.benchmark: `on` times cuDNN's convolution algorithms once per
  /// input shape (at a model's warm-up or first batch of that size) and keeps the fastest; `off`
  /// uses cuDNN's heuristics. Served shapes are few and fixed, so on pays once; the
  /// torch.compile anchors (tools/bench_models/anchors.py) run with it on.
  Setting<bool> cudnn_benchmark{true};

  kernels::Policy kernels;  ///< the `kernels:` section + environment
};

/// Command-line overrides (flags win over the file).
struct Overrides {
  std::optional<std::string> model_repository, grpc_address, http_address;
  std::vector<std::string> load_models;  ///< --load-model NAME (repeatable), replaces the file's
  std::optional<bool> strict_readiness;  ///< --strict-readiness true|false
  /// --drain-seconds S: server.drain_seconds (Triton's --exit-timeout-secs), 0 to 86400
  /// (checked by the caller, server/main.cpp).
  std::optional<double> drain_seconds;
};

/// `path` as written in the configuration file `file`: unchanged when absolute (or when `file`
/// or `path` is ""), else resolved against the folder of `file` and returned absolute and
/// lexically normal (config/server.yaml's "../examples/model_repository" is
/// "<checkout>/examples/model_repository" from any current directory). Used for
/// model_repository; kernels.hub.lock_file and cache_dir follow the same rule (kernels/policy.cpp).
/// Flags and defaults stay relative to the current directory.
std::string path_from_file(const std::string& file, const std::string& path);

/// `path` absolute (against the current directory) and lexically normal; "" stays "". What
/// --print-config and /active show for model_repository.
std::string absolute_path(const std::string& path);

/// Reads `file` (may be "" for defaults only), applies `overrides` and the environment (kernels).
/// Throws ConfigError with file:line:column for unknown keys, wrong types and bad values, and
/// for an unreadable file.
ServerConfig load_config(const std::string& file, const Overrides& overrides,
                         const kernels::Environment& env);

/// Parses YAML text as if read from `file` (tests).
ServerConfig parse_config(const std::string& yaml_text, const std::string& file,
                          const Overrides& overrides, const kernels::Environment& env);

/// Effective configuration as YAML that load_config/parse_config read back to the same values
/// (`--print-config`): one `key: value  # source` line per value, strings double-quoted, the
/// `kernels:` section in its own YAML form (slots.<slot>.allow lists, hub.*). Values set by the
/// environment are printed too (re-reading with the same environment gives the same values);
/// HF_TOKEN is never printed, only whether it is set (a comment).
std::string describe(const ServerConfig& config);

}  // namespace libreyolo::server
