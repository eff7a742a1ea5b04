// The shared-memory parameters of one inference tensor (Triton's shared_memory_region,
// shared_memory_offset, shared_memory_byte_size), for every transport: gRPC
// (server/grpc/grpc_server.cpp, protobuf InferParameter) and REST (server/http/kserve_json.cpp,
// JSON `parameters`) hand their values over as ParamValue and get the same checks and the same
// messages (those of triton-inference-server/server src/grpc/infer_handler.cc
// ParseSharedMemoryParams, plus the bounds this server adds). Binding a tensor to its region
// and writing an output back are here too, so that neither transport repeats them.
// No torch, no gRPC, no JSON library: api types and the Registry only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "server/api/types.h"
#include "server/shm/registry.h"

namespace libreyolo::server::shm {

/// One parameter value as far as the shared-memory parameters care: a string, an integer that
/// fits int64, or anything else (named in the type error).
struct ParamValue {
  enum class Type { string, integer, other } type = Type::other;
  std::string text;          ///< when string
  std::int64_t integer = 0;  ///< when integer
};

/// Looks a parameter of the tensor up by key; nullopt when the tensor does not have it.
using ParamLookup = std::function<std::optional<ParamValue>(const char* key)>;

/// How the transport names the two value types in "expected ..." (gRPC: the InferParameter
/// fields string_param / int64_param, as Triton's gRPC server says; REST: JSON types).
struct TypeNames {
  const char* string;
  const char* integer;
};
constexpr TypeNames kGrpcTypeNames{"string_param", "int64_param"};
constexpr TypeNames kJsonTypeNames{"a JSON string", "a JSON integer"};

/// The shared-memory parameters of one input or requested output; `used` false when the tensor
/// has none (its data travels in the request or the response).
struct TensorShm {
  bool used = false;
  std::string region;
  std::int64_t offset = 0, byte_size = 0;
};

/// Reads and checks the parameters of tensor `tensor`. Throws api::Error INVALID_ARGUMENT:
/// "invalid value type for 'KEY' parameter for tensor 'T', expected <type>."; "'KEY' can not be
/// specified without 'shared_memory_region' parameter for tensor 'T'";
/// "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for
/// tensor 'T'"; "tensor 'T': 'KEY' must not be negative, got N".
TensorShm tensor_shm(const std::string& tensor, const ParamLookup& find, const TypeNames& names);

/// The error for an input that has both shared-memory parameters and data in the request
/// (Triton's message: "unexpected 'content' provided when using shared memory for input tensor
/// 'T' for model 'M'").
api::Error content_with_shm(const std::string& input, const std::string& model);

/// Binds input `t` to its region: `t.owned` (typed = true) receives a copy of the bytes (system
/// shared memory, read with pread: the client may shrink its object while the request runs,
/// registry.h), or `t.device_data` / `device_index` / `device_bytes` name the device bytes (CUDA
/// shared memory; the core reads them on the device). The View goes to `held`, which must live
/// until the core is done with the request. Throws the Registry's acquire errors, shm::read's,
/// and INVALID_ARGUMENT for a BYTES input in CUDA shared memory ("input 'T': a BYTES input
/// cannot be read from CUDA shared memory region 'R'; send it in <alternative> or system shared
/// memory").
void bind_input(api::InputTensor& t, const TensorShm& p, const Registry& registry,
                std::vector<View>& held, const std::string& alternative);

/// A requested output that goes into a shared-memory region.
struct OutputRegion {
  std::string name;
  TensorShm params;
  View view;
};

/// Acquires the region of requested output `name` (the Registry's acquire errors).
OutputRegion bind_output(const std::string& name, const TensorShm& p, const Registry& registry);

/// Checks that output `t` fits its region. Throws INVALID_ARGUMENT "shared memory size specified
/// with the request for output 'T' (B bytes, region 'R') should be at least N bytes to hold the
/// results". Transports check every output before writing any, so a failed call writes nothing.
void check_output(const api::OutputTensor& t, const OutputRegion& target);

/// Writes output `t` into its region (check_output first; then the errors of shm::write).
void write_output(const api::OutputTensor& t, const OutputRegion& target);

/// The parameters an output written into shared memory carries in the response (Triton):
/// shared_memory_region, shared_memory_byte_size (bytes written) and shared_memory_offset when
/// not 0.
std::vector<std::pair<std::string, api::Parameter>> output_params(const api::OutputTensor& t,
                                                                  const OutputRegion& target);

}  // namespace libreyolo::server::shm
