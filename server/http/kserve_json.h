// The KServe v2 REST (Open Inference Protocol over HTTP) message codec: JSON bodies <-> the plain
// api types, with Triton's binary tensor data extension
// (triton-inference-server/server docs/protocol/extension_binary_data.md). Pure functions: no
// sockets, no HTTP library, no torch, so that a libFuzzer target can call them directly
// (parse_infer_request on arbitrary bytes must throw api::Error or return, never crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/types.h"
#include "server/shm/registry.h"
#include "server/shm/tensor_params.h"

namespace libreyolo::server::http {

/// How the response of one infer request is rendered: per output, binary (Triton's
/// `binary_data`: raw bytes after the JSON header) or JSON `data`.
struct OutputFormat {
  /// Request parameter `binary_data_output` (default false): outputs not listed in `outputs`,
  /// and listed ones without their own `binary_data` parameter, are binary when true.
  bool binary_default = false;
  std::map<std::string, bool> binary;  ///< output `parameters.binary_data`, by output name
  /// Outputs written into shared memory, by name: rendered with these `parameters` (region,
  /// bytes written, offset) and no data (Triton); filled by the server after the write.
  std::map<std::string, std::vector<std::pair<std::string, api::Parameter>>> in_shm;
  bool is_binary(const std::string& output) const;
};

/// An infer request as the core takes it, plus the rendering choices for its response.
struct ParsedInfer {
  api::InferRequest request;
  OutputFormat format;
  /// Per input of `request.inputs` (same index): its shared-memory parameters. An input with
  /// `used` has no data yet: the server binds it to its region (shm::bind_input).
  std::vector<shm::TensorShm> input_shm;
  /// Requested outputs that go into shared memory, in request order (name, parameters).
  std::vector<std::pair<std::string, shm::TensorShm>> output_shm;
};

/// Parses the body of `POST /v2/models/{model}[/versions/{version}]/infer`.
///
/// `body` is the whole HTTP body. `header_length` is the value of the request header
/// `Inference-Header-Content-Length` when present: the first N bytes of `body` are the JSON
/// request, the rest is binary tensor data, consumed in input order by every input that has the
/// parameter `binary_data_size` (bytes; raw OIP layout: little-endian elements, BYTES elements
/// each prefixed by a 4-byte little-endian length). Without the header the whole body is JSON.
/// Inputs without `binary_data_size` carry `data`: a JSON array, flat or nested (any nesting;
/// row-major order), of booleans (BOOL), integers in range (INT8..INT64, UINT8..UINT64),
/// numbers (FP16, BF16, FP32, FP64; FP16/BF16 rounded to nearest even) or strings (BYTES); its
/// element count must equal the product of `shape`. Such inputs are packed into the raw layout
/// (`InputTensor::owned`, `typed = true`); binary inputs view `body` (`InputTensor::raw`), so
/// `body` must outlive the returned request.
///
/// Request parameters become `api::Parameter`s (bool, int64 (uint64 above INT64_MAX), double,
/// string), except the two Triton gives to the transport: `binary_data_output` (-> format) and
/// `timeout` (microseconds, an integer >= 0; 0 = none; -> request.deadline from now). Outputs'
/// `binary_data` goes to the format; `classification` (outputs) is refused (not implemented).
/// `shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size` (inputs and
/// outputs; Triton's shared-memory extensions) are checked by shm::tensor_shm, the gRPC
/// side's checks and messages, and go to input_shm / output_shm; an input with them must have
/// neither `data` nor binary_data_size (shm::content_with_shm's message).
///
/// Throws api::Error(invalid_argument) with a message naming the field and the problem (e.g.
/// "input 'images': binary_data_size 40 exceeds the 12 bytes of binary data left").
ParsedInfer parse_infer_request(std::string_view body,
                                std::optional<std::string_view> header_length,
                                const std::string& model_name, const std::string& model_version);

/// A rendered response body. `header_length` is set when binary output data follows the JSON
/// header (the value of the response header `Inference-Header-Content-Length`).
struct RenderedBody {
  std::string body;
  std::optional<std::size_t> header_length;
};

/// Renders an infer response: `{"model_name", "model_version", "id" (when not empty),
/// "outputs": [{"name", "datatype", "shape", "data": [...]} or {..., "parameters":
/// {"binary_data_size": N}}]}` with the binary outputs' raw bytes appended in output order.
/// JSON `data` is the flat row-major element list; BYTES elements are JSON strings (invalid
/// UTF-8 replaced by U+FFFD: ask for binary data to get them byte-exact); a non-finite float is
/// the bare token NaN, Infinity or -Infinity, as Triton writes it. Throws api::Error
/// (internal) when an output's raw data does not match its datatype and shape.
RenderedBody render_infer_response(const api::InferResponse& response, const OutputFormat& format);

/// `{"name", "version", "extensions"}` (GET /v2).
std::string render_server_metadata(const api::ServerMetadata& m);
/// `{"name", "versions", "platform", "inputs", "outputs"}` (GET /v2/models/{m}[/versions/{v}]);
/// tensors as `{"name", "datatype", "shape"}`.
std::string render_model_metadata(const api::ModelMetadata& m);
/// Triton's model configuration JSON (the ModelConfig protobuf with its field names, integers
/// as numbers, as Triton prints it): name, platform, backend, max_batch_size, input/output
/// (`data_type` TYPE_FP32 ..., TYPE_STRING for BYTES; `dims` without the batch dimension),
/// dynamic_batching, parameters ({"key": {"string_value": "..."}}).
std::string render_model_config(const api::ModelConfig& c);
/// `{"model_stats": [...]}` as Triton's statistics extension (GET /v2/models[/{m}]/stats).
std::string render_statistics(const std::vector<api::ModelStatistics>& stats);
/// `[{"name", "version", "state", "reason"}]` (POST /v2/repository/index).
std::string render_repository_index(const std::vector<api::RepositoryEntry>& entries);

/// Parses the optional body of POST /v2/repository/index: "" or `{"ready": bool}`. Throws
/// api::Error(invalid_argument) otherwise.
bool parse_repository_index_request(std::string_view body);
/// Checks the optional body of POST /v2/repository/models/{m}/load|unload: "" or a JSON object
/// (its `parameters` are not used). Throws api::Error(invalid_argument) otherwise.
void check_repository_request(std::string_view body, const char* what);

/// The body of POST /v2/systemsharedmemory/region/{name}/register: {"key": string, "offset":
/// integer >= 0 (optional, 0), "byte_size": integer >= 0}.
struct SystemRegisterRequest {
  std::string key;
  std::uint64_t offset = 0, byte_size = 0;
};
/// Throws api::Error(invalid_argument) naming the field ("the register request body: 'key' is
/// missing").
SystemRegisterRequest parse_system_register(std::string_view body);

/// The body of POST /v2/cudasharedmemory/region/{name}/register (tritonclient.http's):
/// {"raw_handle": {"b64": base64 of the cudaIpcMemHandle_t}, "device_id": integer >= 0,
/// "byte_size": integer >= 0}.
struct CudaRegisterRequest {
  std::string raw_handle;  ///< decoded bytes
  std::int64_t device_id = 0;
  std::uint64_t byte_size = 0;
};
/// Throws api::Error(invalid_argument) naming the field.
CudaRegisterRequest parse_cuda_register(std::string_view body);

/// Triton's status JSON: `[{"name", "key", "offset", "byte_size"}]` (system) and
/// `[{"name", "device_id", "byte_size"}]` (CUDA), sorted by name.
std::string render_system_status(const std::vector<shm::SystemStatus>& regions);
std::string render_cuda_status(const std::vector<shm::CudaStatus>& regions);

/// Standard base64 (RFC 4648 section 4, padding optional) -> bytes; nullopt when not base64.
std::optional<std::string> base64_decode(std::string_view text);

/// `{"error": "<message>"}`; messages longer than 2048 bytes are clipped like the gRPC side's
/// (server/grpc/grpc_server.cpp kMaxStatusMessageBytes).
std::string render_error(const std::string& message);

/// The HTTP status of an api::Code, as Triton's HTTP server maps its error codes
/// (triton-inference-server/server src/http_server.cc HttpCodeFromError: INTERNAL 500,
/// NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, INVALID_ARG / UNKNOWN / CANCELLED /
/// ALREADY_EXISTS 400), and
/// for the codes Triton lacks the HTTP mapping of google/rpc/code.proto (DEADLINE_EXCEEDED 504,
/// RESOURCE_EXHAUSTED 429, PERMISSION_DENIED 403, FAILED_PRECONDITION 400, UNIMPLEMENTED 501).
int http_status(api::Code code);

/// Bytes of one element of an OIP datatype ("FP32" -> 4); 0 for BYTES and unknown names.
std::size_t element_size(std::string_view datatype);

/// IEEE 754 binary16 / bfloat16 <-> float, round to nearest even (NaN stays NaN).
std::uint16_t float_to_half(float f);
float half_to_float(std::uint16_t h);
std::uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(std::uint16_t b);

}  // namespace libreyolo::server::http
