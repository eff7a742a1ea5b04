// See infer_request.h. This translation unit sees Debian's protobuf, never gRPC or torch.
#include "server/rpc/infer_request.h"

#include <cstdint>
#include <cstring>
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

template <class Tensor>
ShmParams shm_params(const Tensor& t) {
  ShmParams p;
  const auto& params = t.parameters();
  auto bad_type = [&](const char* key, const char* want) {
    return api::Error(api::Code::invalid_argument, std::string("invalid value type for '") + key +
                                                       "' parameter for tensor '" + t.name() +
                                                       "', expected " + want + ".");
  };
  auto without = [&](const char* key) {
    return api::Error(api::Code::invalid_argument,
                      std::string("'") + key +
                          "' can not be specified without 'shared_memory_region' parameter for "
                          "tensor '" +
                          t.name() + "'");
  };
  if (auto it = params.find("shared_memory_region"); it != params.end()) {
    if (it->second.parameter_choice_case() != pb::InferParameter::kStringParam)
      throw bad_type("shared_memory_region", "string_param");
    p.used = true;
    p.region = it->second.string_param();
  }
  if (auto it = params.find("shared_memory_offset"); it != params.end()) {
    if (!p.used) throw without("shared_memory_offset");
    if (it->second.parameter_choice_case() != pb::InferParameter::kInt64Param)
      throw bad_type("shared_memory_offset", "int64_param");
    p.offset = it->second.int64_param();
  }
  if (auto it = params.find("shared_memory_byte_size"); it != params.end()) {
    if (!p.used) throw without("shared_memory_byte_size");
    if (it->second.parameter_choice_case() != pb::InferParameter::kInt64Param)
      throw bad_type("shared_memory_byte_size", "int64_param");
    p.byte_size = it->second.int64_param();
  } else if (p.used) {
    throw api::Error(api::Code::invalid_argument,
                     "'shared_memory_byte_size' must be specified along with "
                     "'shared_memory_region' parameter for tensor '" +
                         t.name() + "'");
  }
  // Triton's parameters are int64; a negative one would wrap to a huge size_t there.
  if (p.used && (p.offset < 0 || p.byte_size < 0)) {
    throw api::Error(api::Code::invalid_argument,
                     "tensor '" + t.name() + "': '" +
                         (p.offset < 0 ? "shared_memory_offset" : "shared_memory_byte_size") +
                         "' must not be negative, got " +
                         std::to_string(p.offset < 0 ? p.offset : p.byte_size));
  }
  return p;
}

}  // namespace

api::InferRequest to_infer_request(const pb::ModelInferRequest& r, const shm::Registry& registry,
                                   CallRegions& regions) {
  api::InferRequest out;
  out.model_name = r.model_name();
  out.model_version = r.model_version();
  out.id = r.id();
  for (const auto& [k, v] : r.parameters()) out.parameters[k] = from_pb(v);
  std::vector<ShmParams> shm(static_cast<std::size_t>(r.inputs_size()));
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
      if (in.has_contents()) {
        throw api::Error(api::Code::invalid_argument,
                         "unexpected 'content' provided when using shared memory for input "
                         "tensor '" +
                             in.name() + "' for model '" + r.model_name() + "'");
      }
      shm::View v = registry.acquire(shm[i].region, static_cast<std::uint64_t>(shm[i].offset),
                                     static_cast<std::uint64_t>(shm[i].byte_size));
      if (v.on_device()) {
        // The core reads a device input only as a fixed-size tensor (pixel_values); BYTES
        // elements would have to be parsed on the host.
        if (t.datatype == "BYTES") {
          throw api::Error(api::Code::invalid_argument,
                           "input '" + in.name() +
                               "': a BYTES input cannot be read from CUDA "
                               "shared memory region '" +
                               shm[i].region +
                               "'; send it in raw_input_contents or system shared memory");
        }
        t.device_data = v.data;
        t.device_index = v.region->device_id();
        t.device_bytes = static_cast<std::size_t>(v.byte_size);
      } else {
        t.raw = std::string_view(v.data, static_cast<std::size_t>(v.byte_size));
      }
      regions.inputs.push_back(std::move(v));
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
    ShmParams p = shm_params(o);
    if (!p.used) continue;
    ShmOutput so;
    so.name = o.name();
    so.view = registry.acquire(p.region, static_cast<std::uint64_t>(p.offset),
                               static_cast<std::uint64_t>(p.byte_size));
    so.params = std::move(p);
    regions.outputs.push_back(std::move(so));
  }
  return out;
}

}  // namespace libreyolo::server::rpc
