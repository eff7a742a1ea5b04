// See tensor_params.h. The messages are Triton's (src/grpc/infer_handler.cc
// ParseSharedMemoryParams, src/shared_memory_manager.cc) where Triton has one.
#include "server/shm/tensor_params.h"

#include <utility>

namespace libreyolo::server::shm {

using api::Code;
using api::Error;

TensorShm tensor_shm(const std::string& tensor, const ParamLookup& find, const TypeNames& names) {
  TensorShm p;
  auto bad_type = [&](const char* key, const char* want) {
    return Error(Code::invalid_argument, std::string("invalid value type for '") + key +
                                             "' parameter for tensor '" + tensor + "', expected " +
                                             want + ".");
  };
  auto without = [&](const char* key) {
    return Error(Code::invalid_argument,
                 std::string("'") + key +
                     "' can not be specified without 'shared_memory_region' parameter for "
                     "tensor '" +
                     tensor + "'");
  };
  if (auto v = find("shared_memory_region")) {
    if (v->type != ParamValue::Type::string) throw bad_type("shared_memory_region", names.string);
    p.used = true;
    p.region = std::move(v->text);
  }
  if (auto v = find("shared_memory_offset")) {
    if (!p.used) throw without("shared_memory_offset");
    if (v->type != ParamValue::Type::integer) throw bad_type("shared_memory_offset", names.integer);
    p.offset = v->integer;
  }
  if (auto v = find("shared_memory_byte_size")) {
    if (!p.used) throw without("shared_memory_byte_size");
    if (v->type != ParamValue::Type::integer)
      throw bad_type("shared_memory_byte_size", names.integer);
    p.byte_size = v->integer;
  } else if (p.used) {
    throw Error(Code::invalid_argument,
                "'shared_memory_byte_size' must be specified along with "
                "'shared_memory_region' parameter for tensor '" +
                    tensor + "'");
  }
  // Triton's parameters are int64; a negative one would wrap to a huge size_t there.
  if (p.used && (p.offset < 0 || p.byte_size < 0)) {
    throw Error(Code::invalid_argument,
                "tensor '" + tensor + "': '" +
                    (p.offset < 0 ? "shared_memory_offset" : "shared_memory_byte_size") +
                    "' must not be negative, got " +
                    std::to_string(p.offset < 0 ? p.offset : p.byte_size));
  }
  return p;
}

Error content_with_shm(const std::string& input, const std::string& model) {
  return Error(Code::invalid_argument,
               "unexpected 'content' provided when using shared memory for input tensor '" + input +
                   "' for model '" + model + "'");
}

void bind_input(api::InputTensor& t, const TensorShm& p, const Registry& registry,
                std::vector<View>& held, const std::string& alternative) {
  View v = registry.acquire(p.region, static_cast<std::uint64_t>(p.offset),
                            static_cast<std::uint64_t>(p.byte_size));
  if (v.on_device()) {
    // The core reads a device input only as a fixed-size tensor (pixel_values); BYTES elements
    // would have to be parsed on the host.
    if (t.datatype == "BYTES") {
      throw Error(Code::invalid_argument, "input '" + t.name +
                                              "': a BYTES input cannot be read from CUDA "
                                              "shared memory region '" +
                                              p.region + "'; send it in " + alternative +
                                              " or system shared memory");
    }
    t.device_data = v.data;
    t.device_index = v.region->device_id();
    t.device_bytes = static_cast<std::size_t>(v.byte_size);
  } else {
    // A copy, not a view of the client's object: it may shrink under the request (registry.h).
    t.owned = read(v);
    t.raw = {};
    t.typed = true;
  }
  held.push_back(std::move(v));
}

OutputRegion bind_output(const std::string& name, const TensorShm& p, const Registry& registry) {
  OutputRegion o;
  o.name = name;
  o.view = registry.acquire(p.region, static_cast<std::uint64_t>(p.offset),
                            static_cast<std::uint64_t>(p.byte_size));
  o.params = p;
  return o;
}

void check_output(const api::OutputTensor& t, const OutputRegion& target) {
  if (t.data.size() > target.view.byte_size) {
    throw Error(Code::invalid_argument,
                "shared memory size specified with the request for output '" + t.name + "' (" +
                    std::to_string(target.view.byte_size) + " bytes, region '" +
                    target.params.region + "') should be at least " +
                    std::to_string(t.data.size()) + " bytes to hold the results");
  }
}

void write_output(const api::OutputTensor& t, const OutputRegion& target) {
  check_output(t, target);
  write(target.view, t.data.data(), t.data.size());
}

std::vector<std::pair<std::string, api::Parameter>> output_params(const api::OutputTensor& t,
                                                                  const OutputRegion& target) {
  std::vector<std::pair<std::string, api::Parameter>> out;
  out.emplace_back("shared_memory_region", target.params.region);
  out.emplace_back("shared_memory_byte_size", static_cast<std::int64_t>(t.data.size()));
  if (target.params.offset != 0) out.emplace_back("shared_memory_offset", target.params.offset);
  return out;
}

}  // namespace libreyolo::server::shm
