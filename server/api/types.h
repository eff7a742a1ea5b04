// The plain C++ request/response types between the gRPC transport (libreyolo_rpc, no torch) and
// the serving core (libreyolo_server, torch). Neither protobuf nor torch appears here: this header
// is the seam that keeps the two header worlds apart (DESIGN.md "Header traps").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

namespace libreyolo::server::api {

/// gRPC status codes used by the daemon (values equal grpc::StatusCode).
enum class Code : int {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  already_exists = 6,
  permission_denied = 7,
  resource_exhausted = 8,
  failed_precondition = 9,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
};

/// "OK", "INVALID_ARGUMENT", ... (the names Prometheus labels and logs use).
const char* code_name(Code code);

/// An error that maps to a gRPC status. Thrown by the core; the transport turns it into a Status.
class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

/// A request/response parameter (OIP InferParameter oneof).
using Parameter = std::variant<bool, std::int64_t, std::string, double, std::uint64_t>;

/// One input tensor. `data()` is the tensor in OIP raw layout: row-major little-endian elements;
/// BYTES elements each prefixed by a 4-byte little-endian length. For raw_input_contents it views
/// the request message, valid for the duration of the call. Typed contents are packed into
/// `owned` by the transport, and so is a copy of a system shared-memory input
/// (server/shm/registry.h: never a view of the client's object, which it may shrink).
///
/// A CUDA shared-memory input has no host bytes: `data()` is empty, `device_data` is the
/// device pointer (cudaIpcOpenMemHandle of the client's region + offset, valid for the call)
/// on CUDA device `device_index`, `device_bytes` its size. The transport sends only
/// fixed-size datatypes this way; the core wraps it without a copy
/// (server/tasks/image_inputs.cpp, parse_pixels).
struct InputTensor {
  std::string name;
  std::string datatype;  ///< "FP32", "BYTES", ...
  std::vector<std::int64_t> shape;
  std::string_view raw;               ///< when !typed
  std::string owned;                  ///< when typed
  bool typed = false;                 ///< data is in `owned` (typed contents, a shm copy)
  const void* device_data = nullptr;  ///< CUDA shared memory: device pointer, else null
  int device_index = -1;              ///< CUDA device of device_data
  std::size_t device_bytes = 0;       ///< bytes at device_data
  std::string_view data() const { return typed ? std::string_view(owned) : raw; }
  bool on_device() const { return device_data != nullptr; }
  /// Bytes of the tensor wherever it lives (host data() or device_bytes).
  std::size_t byte_size() const { return on_device() ? device_bytes : data().size(); }
};

/// The cancellation of one call, notified (not polled): the transport calls cancel() when the
/// client cancels (gRPC's ServerUnaryReactor::OnCancel) or the call's deadline passes (a
/// timer), the core subscribes a callback that takes the request out of its model's queue.
/// Thread-safe; the first cancel() wins and later ones do nothing.
class CancelToken {
 public:
  using Callback = std::function<void()>;
  /// Marks the call cancelled with `reason` (Code::cancelled or Code::deadline_exceeded) and
  /// runs every subscribed callback once, on the calling thread, outside the token's lock.
  void cancel(Code reason = Code::cancelled);
  bool cancelled() const;
  /// Code::ok until cancelled, then the reason given to cancel().
  Code reason() const;
  /// Registers `callback`; when the token is already cancelled it runs at once on this thread
  /// (and 0 is returned). Returns an id for unsubscribe().
  int subscribe(Callback callback);
  /// Removes the callback `id` (0 and unknown ids are ignored). When cancel() is running the
  /// callbacks on another thread at that moment, waits until they returned: after unsubscribe() the
  /// callback neither runs nor will run, so it may reference the subscriber's stack.
  void unsubscribe(int id);

 private:
  mutable std::mutex mu_;
  std::condition_variable done_;
  Code reason_ = Code::ok;
  int next_id_ = 1;
  std::map<int, Callback> callbacks_;
  std::thread::id runner_;  ///< the thread running the callbacks now, none when idle
};

/// ModelInferRequest after transport checks (raw/typed exclusivity, raw count).
struct InferRequest {
  std::string model_name;
  std::string model_version;  ///< "" = the served (highest) version
  std::string id;
  std::map<std::string, Parameter> parameters;
  std::vector<InputTensor> inputs;
  std::vector<std::string> requested_outputs;  ///< empty: the default outputs
  /// Client deadline (grpc-timeout), if any.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  /// Notified when the client cancels or the deadline passes (null: the transport cannot
  /// tell). The core answers a cancelled request that still waits in a queue at once.
  std::shared_ptr<CancelToken> cancel;
};

/// One output tensor, raw layout (see InputTensor).
struct OutputTensor {
  std::string name;
  std::string datatype;
  std::vector<std::int64_t> shape;
  std::string data;
  /// Response parameters of the output (the transport sets shared_memory_region,
  /// shared_memory_offset, shared_memory_byte_size for an output written into a region; the
  /// client reads them back). The core leaves it empty.
  std::map<std::string, Parameter> parameters;
};

struct InferResponse {
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<OutputTensor> outputs;
};

struct TensorMetadata {
  std::string name;
  std::string datatype;
  std::vector<std::int64_t> shape;  ///< -1: variable
  bool optional = false;
};

struct ServerMetadata {
  std::string name;
  std::string version;
  std::vector<std::string> extensions;
};

struct ModelMetadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<TensorMetadata> inputs;
  std::vector<TensorMetadata> outputs;
};

/// One instance group as ModelConfig reports it (Triton's ModelInstanceGroup): the serving.yaml
/// entry, its kind resolved (KIND_AUTO becomes what it ran as).
struct InstanceGroupConfig {
  std::string name;  ///< "<model>_<entry index>" (Triton's default group name)
  std::string kind;  ///< "KIND_GPU" | "KIND_CPU"
  int count = 1;     ///< instances per GPU (KIND_GPU) or in all (KIND_CPU)
  std::vector<int> gpus;
};

/// What ModelConfig reports (Triton ModelConfig subset). Tensor dims exclude the batch dimension.
struct ModelConfig {
  std::string name;
  std::string platform;
  std::string backend;
  int max_batch_size = 0;
  std::vector<TensorMetadata> inputs;   ///< dims without the batch dimension
  std::vector<TensorMetadata> outputs;  ///< dims without the batch dimension
  std::uint64_t max_queue_delay_microseconds = 0;
  std::uint32_t max_queue_size = 0;
  std::uint64_t default_timeout_microseconds = 0;
  std::map<std::string, std::string> parameters;
  std::vector<InstanceGroupConfig> instance_group;  ///< every instance the model runs
};

/// Cumulative count and nanoseconds (Triton StatisticDuration).
struct Duration {
  std::uint64_t count = 0;
  std::uint64_t ns = 0;
};

struct BatchStatistics {
  std::uint64_t batch_size = 0;
  Duration compute_input, compute_infer, compute_output;
};

struct ModelStatistics {
  std::string name;
  std::string version;
  std::uint64_t last_inference_ms = 0;  ///< since the epoch; 0: never
  std::uint64_t inference_count = 0;    ///< images inferred
  std::uint64_t execution_count = 0;    ///< batches run
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::vector<BatchStatistics> batch_stats;
};

struct RepositoryEntry {
  std::string name;
  std::string version;
  std::string state;   ///< "READY", "UNAVAILABLE", "LOADING"
  std::string reason;  ///< why not ready
};

/// The serving core as the transport sees it. Implemented on the torch side
/// (server/core/core.h). Every method may throw api::Error; other exceptions are INTERNAL.
class InferenceService {
 public:
  virtual ~InferenceService() = default;
  virtual bool live() const = 0;
  /// Every model loaded and warmed, and not draining.
  virtual bool ready() const = 0;
  /// False for unknown models and versions.
  virtual bool model_ready(const std::string& name, const std::string& version) const = 0;
  virtual ServerMetadata server_metadata() const = 0;
  /// NOT_FOUND for unknown models/versions.
  virtual ModelMetadata model_metadata(const std::string& name,
                                       const std::string& version) const = 0;
  virtual ModelConfig model_config(const std::string& name, const std::string& version) const = 0;
  /// Empty name: every model.
  virtual std::vector<ModelStatistics> model_statistics(const std::string& name,
                                                        const std::string& version) const = 0;
  virtual std::vector<RepositoryEntry> repository_index(bool ready_only) const = 0;
  /// PERMISSION_DENIED unless model_control allows it.
  virtual void load_model(const std::string& name) = 0;
  virtual void unload_model(const std::string& name) = 0;
  /// Blocks until the response is ready. Throws api::Error with the code to return.
  virtual InferResponse infer(InferRequest&& request) = 0;
};

}  // namespace libreyolo::server::api
