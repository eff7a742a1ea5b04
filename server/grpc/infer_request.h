// The OIP request conversion of the gRPC transport: inference.ModelInferRequest ->
// api::InferRequest (names, datatypes, shapes, parameters, raw or typed contents, Triton's
// shared-memory parameters bound through server/shm/tensor_params.h), with the checks that
// belong to the wire format (raw_input_contents count, one typed field per tensor). Split out
// of grpc_server.cpp so that the OIP fuzz target (tests/fuzz/oip_request_fuzz.cpp) runs exactly
// what ModelInfer runs before ServerCore::infer. No gRPC and no torch here; the protobuf
// message is only forward-declared.
#pragma once

#include <vector>

#include "server/api/types.h"
#include "server/shm/registry.h"
#include "server/shm/tensor_params.h"

namespace inference {
class ModelInferRequest;
}

namespace libreyolo::server::rpc {

/// The regions one ModelInfer holds (inputs read in place, outputs written at the end): the
/// Views keep each mapping alive until the call is answered, whatever unregisters it meanwhile.
struct CallRegions {
  std::vector<shm::View> inputs;
  std::vector<shm::OutputRegion> outputs;
};

/// Converts a parsed ModelInferRequest. Raw inputs are views into `request`'s
/// raw_input_contents (InputTensor::raw) or into a registered region (held in `regions`):
/// `request` and `regions` must outlive the result. Typed contents are packed into the raw
/// little-endian layout (InputTensor::owned; BYTES as 4-byte length + bytes). Leaves `cancel`
/// and `deadline` unset (the transport sets them from its call). Throws api::Error
/// INVALID_ARGUMENT naming the input (raw_input_contents count differing from the inputs
/// outside shared memory, contents and raw_input_contents both set, typed contents in another
/// datatype's field or in several, a datatype without a typed field, bad shared-memory
/// parameters) and the registry's NOT_FOUND / INVALID_ARGUMENT for an unknown region or bounds
/// outside it.
api::InferRequest to_infer_request(const inference::ModelInferRequest& request,
                                   const shm::Registry& registry, CallRegions& regions);

}  // namespace libreyolo::server::rpc
