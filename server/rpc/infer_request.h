// The OIP request conversion of the gRPC transport: inference.ModelInferRequest ->
// api::InferRequest (names, datatypes, shapes, parameters, raw or typed contents), with the
// checks that belong to the wire format (raw_input_contents count, one typed field per tensor).
// Split out of grpc_server.cpp so that the OIP fuzz target (models/fuzz/oip_request_fuzz.cpp)
// runs exactly what ModelInfer runs before ServerCore::infer. No gRPC and no torch here; the
// protobuf message is only forward-declared.
#pragma once

#include "server/api/types.h"

namespace inference {
class ModelInferRequest;
}

namespace libreyolo::server::rpc {

/// Converts a parsed ModelInferRequest. Raw inputs are views into `request`'s
/// raw_input_contents (InputTensor::raw): `request` must outlive the result. Typed contents
/// are packed into the raw little-endian layout (InputTensor::owned; BYTES as 4-byte length +
/// bytes). Leaves `cancelled` and `deadline` unset (the transport sets them from its call).
/// Throws api::Error INVALID_ARGUMENT naming the input: raw_input_contents count differing from
/// the inputs, contents and raw_input_contents both set, typed contents in another datatype's
/// field or in several fields, a datatype without a typed field (FP16, BF16).
api::InferRequest to_infer_request(const inference::ModelInferRequest& request);

}  // namespace libreyolo::server::rpc
