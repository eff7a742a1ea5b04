// The load of libreyolo-bench: asynchronous ModelInfer calls on one completion queue, either a
// fixed number in flight (closed loop, perf_analyzer's --concurrency-range) or Poisson arrivals at
// a fixed rate (open loop, perf_analyzer's --request-distribution poisson). No protobuf or gRPC
// type appears here; load.cpp owns them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace libreyolo::bench {

/// Where the requests go.
struct Target {
  std::string server = "localhost:8001";  ///< host:port of inference.GRPCInferenceService
  std::string model = "rtdetr_tiny";
  std::string version;  ///< "" = the served version
  int channels = 1;     ///< separate HTTP/2 connections, calls spread round-robin
  std::size_t max_message_bytes = 256u << 20;
  double timeout_s = 30;  ///< per-request gRPC deadline; <= 0: none
};

/// One ModelInfer request, sent unchanged by every call (serialized once).
struct Payload {
  std::string input_name;  ///< "images" (BYTES) or "pixel_values" (FP32)
  std::string datatype;    ///< "BYTES" or "FP32"
  std::vector<std::int64_t> shape;
  std::string raw;                           ///< raw_input_contents[0]: OIP raw layout
  std::map<std::string, double> parameters;  ///< double_param request parameters (threshold)
  std::int64_t images = 1;                   ///< images per request (inferences it counts for)
  /// Non-empty: the input is read by the server from this registered shared-memory region
  /// (shared_memory_region / shared_memory_byte_size parameters, no raw_input_contents; see
  /// SharedInput), `raw.size()` bytes at offset 0.
  std::string shm_region;
};

/// The payload's input placed in shared memory and registered with the server, for
/// --shm system (a POSIX shm object, SystemSharedMemoryRegister) or --shm cuda (cudaMalloc +
/// cudaIpcGetMemHandle, CudaSharedMemoryRegister on device 0; only in a build with CUDA). Every
/// call of the run reads the same region (the server only reads inputs). The destructor
/// unregisters and frees it. Throws std::runtime_error with the server's status message.
class SharedInput {
 public:
  SharedInput(const Target& target, const std::string& kind, const std::string& bytes);
  ~SharedInput();
  SharedInput(const SharedInput&) = delete;
  SharedInput& operator=(const SharedInput&) = delete;
  const std::string& region() const { return region_; }

 private:
  Target target_;
  std::string kind_, region_, key_;
  void* host_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
};

/// One measured step. The clock starts when the step starts: `warmup_s` of load that is not
/// recorded, then `duration_s` whose completed requests are recorded, then the calls still in
/// flight are awaited and dropped.
struct Step {
  int concurrency = 0;  ///< > 0: closed loop with this many calls in flight
  double rate = 0;      ///< > 0: open loop, Poisson arrivals at this many requests/s
  double warmup_s = 2;
  double duration_s = 10;
  int max_outstanding = 4096;  ///< open loop: arrivals beyond this many in flight are dropped
  std::uint64_t seed = 1;      ///< of the Poisson inter-arrival times
};

/// What one step measured: every request that completed inside the measurement window.
struct StepResult {
  Step step;
  std::int64_t images_per_request = 1;
  double window_s = 0;                          ///< measured wall time (duration_s)
  std::uint64_t ok = 0;                         ///< OK responses completed inside the window
  std::vector<double> latency_ms;               ///< of those, send -> response, ms
  std::map<std::string, std::uint64_t> errors;  ///< gRPC status name -> count, inside the window
  std::string first_error;                      ///< one error message, for the report
  std::uint64_t dropped = 0;  ///< open loop: arrivals not sent (max_outstanding reached)
};

/// Sends the load. Construction connects (throws std::runtime_error naming the server when it
/// cannot within `connect_timeout_s`) and sends one probe request (deadline max(timeout_s, 60 s)),
/// so that a wrong model name or input fails at once with the daemon's own status message.
class LoadGenerator {
 public:
  LoadGenerator(const Target& target, const Payload& payload, double connect_timeout_s = 20);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  /// Runs one step (blocking for about warmup_s + duration_s + the slowest call in flight).
  /// Throws std::invalid_argument when neither or both of concurrency and rate are set.
  StepResult run(const Step& step);

  /// The probe's answer, e.g. "ok: 5 outputs (num_detections [1] ...)".
  const std::string& probe_summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::bench
