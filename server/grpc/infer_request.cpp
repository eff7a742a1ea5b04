// See infer_request.h. This translation unit sees Debian's protobuf, never gRPC or torch.
#include "server/grpc/infer_request.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>

#include "inference/grpc_predict_v2.pb.h"

namespace libreyolo::server::rpc {

namespace pb = ::inference;

namespace {

api::Parameter from_pb(const pb::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case pb::InferParameter::kBoolParam:
      return p.bool_param();
    case pb::InferParameter::kInt64Param:
      return p.int64_param();
    case pb::InferParameter::kStringParam:
      return p.string_param();
    case pb::InferParameter::kDoubleParam:
      return p.double_param();
    case pb::InferParameter::kUint64Param:
      return p.uint64_param();
    default:
      return std::string();
  }
}

template <class T, class Src>
void append_as(std::string& out, const Src& values) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T) * static_cast<std::size_t>(values.size()));
  char* p = out.data() + at;
  for (const auto& v : values) {
    const T t = static_cast<T>(v);
    std::memcpy(p, &t, sizeof(T));
    p += sizeof(T);
  }
}

/// Number of non-empty typed fields of `c` (at most one may be used).
int filled_fields(const pb::InferTensorContents& c) {
  return (c.bool_contents_size() > 0) + (c.int_contents_size() > 0) +
         (c.int64_contents_size() > 0) + (c.uint_contents_size() > 0) +
         (c.uint64_contents_size() > 0) + (c.fp32_contents_size() > 0) +
         (c.fp64_contents_size() > 0) + (c.bytes_contents_size() > 0);
}

/// Packs typed contents into the raw layout. Throws api::Error naming the tensor when the
/// datatype has no typed field or the contents sit in another datatype's field.
std::string pack_typed(const pb::ModelInferRequest::InferInputTensor& in) {
  const auto& c = in.contents();
  const std::string& dt = in.datatype();
  auto wrong = [&](const char* field) {
    return api::Error(api::Code::invalid_argument, "input '" + in.name() + "': datatype " + dt +
                                                       " expects typed contents in " + field +
                                                       ", found another field");
  };
  const int filled = filled_fields(c);
  std::string out;
  auto need = [&](int size, const char* field) {
    if (filled > 1 || (filled == 1 && size == 0)) throw wrong(field);
  };
  if (dt == "FP32") {
    need(c.fp32_contents_size(), "fp32_contents");
    append_as<float>(out, c.fp32_contents());
  } else if (dt == "FP64") {
    need(c.fp64_contents_size(), "fp64_contents");
    append_as<double>(out, c.fp64_contents());
  } else if (dt == "INT64") {
    need(c.int64_contents_size(), "int64_contents");
    append_as<std::int64_t>(out, c.int64_contents());
  } else if (dt == "INT32") {
    need(c.int_contents_size(), "int_contents");
    append_as<std::int32_t>(out, c.int_contents());
  } else if (dt == "INT16") {
    need(c.int_contents_size(), "int_contents");
    append_as<std::int16_t>(out, c.int_contents());
  } else if (dt == "INT8") {
    need(c.int_contents_size(), "int_contents");
    append_as<std::int8_t>(out, c.int_contents());
  } else if (dt == "UINT64") {
    need(c.uint64_contents_size(), "uint64_contents");
    append_as<std::uint64_t>(out, c.uint64_contents());
  } else if (dt == "UINT32") {
    need(c.uint_contents_size(), "uint_contents");
    append_as<std::uint32_t>(out, c.uint_contents());
  } else if (dt == "UINT16") {
    need(c.uint_contents_size(), "uint_contents");
    append_as<std::uint16_t>(out, c.uint_contents());
  } else if (dt == "UINT8") {
    need(c.uint_contents_size(), "uint_contents");
    append_as<std::uint8_t>(out, c.uint_contents());
  } else if (dt == "BOOL") {
    need(c.bool_contents_size(), "bool_contents");
    append_as<std::uint8_t>(out, c.bool_contents());
  } else if (dt == "BYTES") {
    need(c.bytes_contents_size(), "bytes_contents");
    for (const auto& b : c.bytes_contents()) {
      const auto n = static_cast<std::uint32_t>(b.size());
      char len[4];
      std::memcpy(len, &n, 4);  // little-endian hosts only (x86-64, aarch64)
      out.append(len, 4);
      out.append(b);
    }
  } else {
    throw api::Error(api::Code::invalid_argument,
                     "input '" + in.name() + "': datatype '" + dt +
                         "' has no typed contents field; send it in raw_input_contents");
  }
  return out;
}

/// The shared-memory parameters of tensor `t` (server/shm/tensor_params.h: the checks and
/// messages the REST transport shares).
template <class Tensor>
shm::TensorShm shm_params(const Tensor& t) {
  const auto& params = t.parameters();
  return shm::tensor_shm(
      t.name(),
      [&](const char* key) -> std::optional<shm::ParamValue> {
        const auto it = params.find(key);
        if (it == params.end()) return std::nullopt;
        shm::ParamValue v;
        if (it->second.parameter_choice_case() == pb::InferParameter::kStringParam) {
          v.type = shm::ParamValue::Type::string;
          v.text = it->second.string_param();
        } else if (it->second.parameter_choice_case() == pb::InferParameter::kInt64Param) {
          v.type = shm::ParamValue::Type::integer;
          v.integer = it->second.int64_param();
        }
        return v;
      },
      shm::kGrpcTypeNames);
}

}  // namespace

api::InferRequest to_infer_request(const pb::ModelInferRequest& r, const shm::Registry& registry,
                                   CallRegions& regions) {
  api::InferRequest out;
  out.model_name = r.model_name();
  out.model_version = r.model_version();
  out.id = r.id();
  for (const auto& [k, v] : r.parameters()) out.parameters[k] = from_pb(v);
  std::vector<shm::TensorShm> shm(static_cast<std::size_t>(r.inputs_size()));
  int outside = 0;  // inputs whose data is not in shared memory
  for (int i = 0; i < r.inputs_size(); ++i) {
    shm[i] = shm_params(r.inputs(i));
    outside += !shm[i].used;
  }
  const bool raw = r.raw_input_contents_size() > 0;
  if (raw && r.raw_input_contents_size() != outside) {
    std::ostringstream m;
    m << "raw_input_contents has " << r.raw_input_contents_size() << " entries for " << outside
      << " inputs" << (outside == r.inputs_size() ? "" : " outside shared memory");
    throw api::Error(api::Code::invalid_argument, m.str());
  }
  int next_raw = 0;
  for (int i = 0; i < r.inputs_size(); ++i) {
    const auto& in = r.inputs(i);
    api::InputTensor t;
    t.name = in.name();
    t.datatype = in.datatype();
    t.shape.assign(in.shape().begin(), in.shape().end());
    if (shm[i].used) {
      if (in.has_contents()) throw shm::content_with_shm(in.name(), r.model_name());
      shm::bind_input(t, shm[i], registry, regions.inputs, "raw_input_contents");
    } else if (raw) {
      if (in.has_contents()) {
        throw api::Error(
            api::Code::invalid_argument,
            "input '" + in.name() + "': both contents and raw_input_contents are set; use one");
      }
      t.raw = r.raw_input_contents(next_raw++);
    } else {
      t.typed = true;
      t.owned = pack_typed(in);
    }
    out.inputs.push_back(std::move(t));
  }
  for (const auto& o : r.outputs()) {
    out.requested_outputs.push_back(o.name());
    const shm::TensorShm p = shm_params(o);
    if (p.used) regions.outputs.push_back(shm::bind_output(o.name(), p, registry));
  }
  return out;
}

}  // namespace libreyolo::server::rpc
