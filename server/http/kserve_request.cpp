// KServe v2 REST codec, request side (see kserve_json.h): the infer request in JSON with Triton's
// binary tensor data (kserve/open-inference-protocol docs/specification, REST, and
// triton-inference-server/server docs/protocol/extension_binary_data.md), and the repository and
// shared-memory request bodies.
#include "server/http/kserve_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "server/http/kserve_json_detail.h"

namespace libreyolo::server::http {
using namespace kserve_detail;  // the codec's shared helpers

namespace {

api::Parameter to_parameter(const std::string& key, const json& v) {
  switch (v.type()) {
    case json::value_t::boolean:
      return v.get<bool>();
    case json::value_t::number_integer:
      return v.get<std::int64_t>();
    case json::value_t::number_unsigned: {
      const auto u = v.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return static_cast<std::int64_t>(u);
      return u;
    }
    case json::value_t::number_float:
      return v.get<double>();
    case json::value_t::string:
      return v.get<std::string>();
    default:
      bad("parameter " + quote_name(key) + " must be a boolean, a number or a string, got " +
          type_name(v));
  }
}

/// A non-negative integer parameter (binary_data_size, timeout).
std::uint64_t unsigned_param(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  bad(what + " must be an integer >= 0, got " + preview(v));
}

/// Appends one JSON element as `dt`; throws naming the input, the element and the range.
void pack_element(std::string& out, const json& v, const std::string& dt, const std::string& what,
                  std::uint64_t index) {
  auto fail = [&](const std::string& expected) {
    bad(what + ": element " + std::to_string(index) + " of data must be " + expected + " for " +
        dt + ", got " + (v.is_string() ? std::string("a string") : preview(v)));
  };
  auto integer = [&](auto tag, const char* range) {
    using T = decltype(tag);
    if (!v.is_number_integer()) fail(std::string("an integer ") + range);
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        fail(std::string("an integer ") + range);
      put<T>(out, static_cast<T>(u));
    } else {
      const auto s = v.get<std::int64_t>();
      if constexpr (std::is_signed_v<T>) {
        if (s < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
            s > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
          fail(std::string("an integer ") + range);
      } else {
        if (s < 0 || static_cast<std::uint64_t>(s) > std::numeric_limits<T>::max())
          fail(std::string("an integer ") + range);
      }
      put<T>(out, static_cast<T>(s));
    }
  };
  if (dt == "FP32") {
    if (!v.is_number()) fail("a number");
    put<float>(out, static_cast<float>(v.get<double>()));
  } else if (dt == "FP64") {
    if (!v.is_number()) fail("a number");
    put<double>(out, v.get<double>());
  } else if (dt == "FP16") {
    if (!v.is_number()) fail("a number");
    put<std::uint16_t>(out, float_to_half(static_cast<float>(v.get<double>())));
  } else if (dt == "BF16") {
    if (!v.is_number()) fail("a number");
    put<std::uint16_t>(out, float_to_bfloat16(static_cast<float>(v.get<double>())));
  } else if (dt == "INT64") {
    integer(std::int64_t{}, "from -9223372036854775808 to 9223372036854775807");
  } else if (dt == "INT32") {
    integer(std::int32_t{}, "from -2147483648 to 2147483647");
  } else if (dt == "INT16") {
    integer(std::int16_t{}, "from -32768 to 32767");
  } else if (dt == "INT8") {
    integer(std::int8_t{}, "from -128 to 127");
  } else if (dt == "UINT64") {
    integer(std::uint64_t{}, "from 0 to 18446744073709551615");
  } else if (dt == "UINT32") {
    integer(std::uint32_t{}, "from 0 to 4294967295");
  } else if (dt == "UINT16") {
    integer(std::uint16_t{}, "from 0 to 65535");
  } else if (dt == "UINT8") {
    integer(std::uint8_t{}, "from 0 to 255");
  } else if (dt == "BOOL") {
    if (!v.is_boolean()) fail("true or false");
    out.push_back(v.get<bool>() ? 1 : 0);
  } else {  // BYTES (the caller checked the datatype)
    if (!v.is_string()) fail("a string");
    const auto& s = v.get_ref<const std::string&>();
    put<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
    out.append(s);
  }
}

/// Packs a JSON `data` array (flat or nested, walked without recursion) into the raw layout.
std::string pack_data(const json& data, const std::string& dt, std::uint64_t expected,
                      const std::vector<std::int64_t>& shape, const std::string& what) {
  if (!data.is_array()) bad(what + ": data must be an array, got " + type_name(data));
  std::string out;
  std::vector<std::pair<const json*, std::size_t>> stack{{&data, 0}};
  std::uint64_t count = 0;
  while (!stack.empty()) {
    auto& [array, at] = stack.back();
    if (at == array->size()) {
      stack.pop_back();
      continue;
    }
    const json& v = (*array)[at++];
    if (v.is_array()) {
      stack.emplace_back(&v, 0);
      continue;
    }
    if (count == expected)
      bad(what + ": data has more than the " + std::to_string(expected) + " elements of shape " +
          shape_text(shape));
    pack_element(out, v, dt, what, count);
    ++count;
  }
  if (count != expected)
    bad(what + ": data has " + std::to_string(count) + " elements, shape " + shape_text(shape) +
        " has " + std::to_string(expected));
  return out;
}

bool known_datatype(const std::string& dt) { return dt == "BYTES" || element_size(dt) > 0; }

/// The shared-memory parameters of tensor `name` from its JSON `parameters` (null: none).
shm::TensorShm json_shm(const std::string& name, const json* params) {
  if (!params) return {};
  return shm::tensor_shm(
      name,
      [&](const char* key) -> std::optional<shm::ParamValue> {
        const json* v = member(*params, key);
        if (!v) return std::nullopt;
        shm::ParamValue p;
        if (v->is_string()) {
          p.type = shm::ParamValue::Type::string;
          p.text = v->get<std::string>();
        } else if (v->is_number_integer() &&
                   (!v->is_number_unsigned() ||
                    v->get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX))) {
          p.type = shm::ParamValue::Type::integer;
          p.integer = v->get<std::int64_t>();
        }
        return p;
      },
      shm::kJsonTypeNames);
}

std::size_t parse_header_length(std::string_view value, std::size_t body_size) {
  const std::string shown(value.substr(0, 32));
  if (value.empty() || value.size() > 19)
    bad("Inference-Header-Content-Length '" + shown + "' is not a byte count");
  std::uint64_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9')
      bad("Inference-Header-Content-Length '" + shown + "' is not a byte count");
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (n > body_size)
    bad("Inference-Header-Content-Length " + std::to_string(n) + " exceeds the body's " +
        std::to_string(body_size) + " bytes");
  return static_cast<std::size_t>(n);
}

}  // namespace

ParsedInfer parse_infer_request(std::string_view body,
                                std::optional<std::string_view> header_length,
                                const std::string& model_name, const std::string& model_version) {
  const std::size_t json_size =
      header_length ? parse_header_length(*header_length, body.size()) : body.size();
  const json j = parse_json(body.substr(0, json_size), "the request body");
  std::string_view binary = body.substr(json_size);
  if (!j.is_object()) bad("the request body must be a JSON object, got " + type_name(j));

  ParsedInfer out;
  api::InferRequest& r = out.request;
  r.model_name = model_name;
  r.model_version = model_version;
  if (const json* id = member(j, "id")) {
    if (!id->is_string()) bad("'id' must be a string, got " + type_name(*id));
    r.id = id->get<std::string>();
  }
  if (const json* params = member(j, "parameters")) {
    if (!params->is_object()) bad("'parameters' must be an object, got " + type_name(*params));
    for (const auto& [key, v] : params->items()) {
      if (key == "binary_data_output") {
        if (!v.is_boolean()) bad("parameter 'binary_data_output' must be true or false");
        out.format.binary_default = v.get<bool>();
      } else if (key == "timeout") {
        // Triton's request timeout, microseconds (docs/protocol/extension_parameters.md).
        const std::uint64_t us = unsigned_param(v, "parameter 'timeout' (microseconds)");
        if (us > 0) {
          const auto capped = std::min<std::uint64_t>(us, std::uint64_t{86400} * 1000000 * 365);
          r.deadline = std::chrono::steady_clock::now() +
                       std::chrono::microseconds(static_cast<std::int64_t>(capped));
        }
      } else {
        r.parameters[key] = to_parameter(key, v);
      }
    }
  }

  const json* inputs = member(j, "inputs");
  if (!inputs) bad("'inputs' is missing");
  if (!inputs->is_array()) bad("'inputs' must be an array, got " + type_name(*inputs));
  std::size_t index = 0;
  for (const json& in : *inputs) {
    const std::string at = "inputs[" + std::to_string(index++) + "]";
    if (!in.is_object()) bad(at + " must be an object, got " + type_name(in));
    api::InputTensor t;
    t.name = string_member(in, "name", at);
    const std::string what = "input " + quote_name(t.name);
    t.datatype = string_member(in, "datatype", what);
    if (!known_datatype(t.datatype))
      bad(what + ": unknown datatype " + quote_name(t.datatype) +
          " (BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, FP32, "
          "FP64, BYTES)");
    const json* shape = member(in, "shape");
    if (!shape) bad(what + ": 'shape' is missing");
    if (!shape->is_array()) bad(what + ": 'shape' must be an array, got " + type_name(*shape));
    for (const json& d : *shape) {
      if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<std::int64_t>() < 0) ||
          (d.is_number_unsigned() &&
           d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)))
        bad(what + ": 'shape' must hold integers >= 0, got " + preview(d));
      t.shape.push_back(d.get<std::int64_t>());
    }
    const std::uint64_t count = element_count(t.shape, what);
    std::optional<std::uint64_t> binary_size;
    shm::TensorShm in_shm;
    if (const json* p = member(in, "parameters")) {
      if (!p->is_object()) bad(what + ": 'parameters' must be an object, got " + type_name(*p));
      in_shm = json_shm(t.name, p);
      if (const json* b = member(*p, "binary_data_size"))
        binary_size = unsigned_param(*b, what + ": binary_data_size");
    }
    const json* data = member(in, "data");
    if (in_shm.used && (binary_size || data)) throw shm::content_with_shm(t.name, model_name);
    if (binary_size && data) bad(what + ": both 'data' and binary_data_size are set; use one");
    if (in_shm.used) {
      // The data is in the region: the server binds it (shm::bind_input) and the core checks
      // its size against the shape, as for gRPC.
    } else if (binary_size) {
      if (*binary_size > binary.size())
        bad(what + ": binary_data_size " + std::to_string(*binary_size) + " exceeds the " +
            std::to_string(binary.size()) + " bytes of binary data left");
      const std::size_t size = element_size(t.datatype);
      if (size > 0 && *binary_size != count * size)
        bad(what + ": binary_data_size " + std::to_string(*binary_size) + " does not match shape " +
            shape_text(t.shape) + " of " + t.datatype + " (" + std::to_string(count * size) +
            " bytes)");
      t.raw = binary.substr(0, static_cast<std::size_t>(*binary_size));
      binary.remove_prefix(static_cast<std::size_t>(*binary_size));
    } else if (data) {
      t.typed = true;
      t.owned = pack_data(*data, t.datatype, count, t.shape, what);
    } else {
      bad(what + ": neither 'data' nor the binary_data_size parameter is set");
    }
    r.inputs.push_back(std::move(t));
    out.input_shm.push_back(std::move(in_shm));
  }
  if (!binary.empty())
    bad(std::to_string(binary.size()) +
        " bytes of binary data after the last input's (the binary_data_size parameters must add "
        "up to the body after Inference-Header-Content-Length)");

  if (const json* outputs = member(j, "outputs")) {
    if (!outputs->is_array()) bad("'outputs' must be an array, got " + type_name(*outputs));
    index = 0;
    for (const json& o : *outputs) {
      const std::string at = "outputs[" + std::to_string(index++) + "]";
      if (!o.is_object()) bad(at + " must be an object, got " + type_name(o));
      const std::string name = string_member(o, "name", at);
      const std::string what = "output " + quote_name(name);
      if (const json* p = member(o, "parameters")) {
        if (!p->is_object()) bad(what + ": 'parameters' must be an object, got " + type_name(*p));
        shm::TensorShm o_shm = json_shm(name, p);
        if (o_shm.used) out.output_shm.emplace_back(name, std::move(o_shm));
        if (member(*p, "classification"))
          bad(what +
              ": the classification extension is not supported (classifiers return "
              "scores, labels and label_names: server/README.md)");
        if (const json* b = member(*p, "binary_data")) {
          if (!b->is_boolean()) bad(what + ": binary_data must be true or false");
          out.format.binary[name] = b->get<bool>();
        }
      }
      r.requested_outputs.push_back(name);
    }
  }
  return out;
}

bool parse_repository_index_request(std::string_view body) {
  if (body.empty()) return false;
  const json j = parse_json(body, "the request body");
  if (!j.is_object()) bad("the request body must be a JSON object, got " + type_name(j));
  const json* ready = member(j, "ready");
  if (!ready) return false;
  if (!ready->is_boolean()) bad("'ready' must be true or false, got " + type_name(*ready));
  return ready->get<bool>();
}

void check_repository_request(std::string_view body, const char* what) {
  if (body.empty()) return;
  const json j = parse_json(body, what);
  if (!j.is_object()) bad(std::string(what) + " must be a JSON object, got " + type_name(j));
}

std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

SystemRegisterRequest parse_system_register(std::string_view body) {
  const char* what = "the register request body";
  const json j = parse_json(body, what);
  if (!j.is_object()) bad(std::string(what) + " must be a JSON object, got " + type_name(j));
  SystemRegisterRequest r;
  r.key = string_member(j, "key", what);
  if (const json* o = member(j, "offset"))
    r.offset = unsigned_param(*o, std::string(what) + ": 'offset'");
  const json* size = member(j, "byte_size");
  if (!size) bad(std::string(what) + ": 'byte_size' is missing");
  r.byte_size = unsigned_param(*size, std::string(what) + ": 'byte_size'");
  return r;
}

CudaRegisterRequest parse_cuda_register(std::string_view body) {
  const std::string what = "the register request body";
  const json j = parse_json(body, what.c_str());
  if (!j.is_object()) bad(what + " must be a JSON object, got " + type_name(j));
  CudaRegisterRequest r;
  const json* handle = member(j, "raw_handle");
  if (!handle) bad(what + ": 'raw_handle' is missing");
  if (!handle->is_object())
    bad(what + ": 'raw_handle' must be an object {\"b64\": \"...\"}, got " + type_name(*handle));
  const std::string b64 = string_member(*handle, "b64", what + ": raw_handle");
  auto bytes = base64_decode(b64);
  if (!bytes) bad(what + ": raw_handle.b64 is not base64");
  r.raw_handle = std::move(*bytes);
  const json* device = member(j, "device_id");
  if (!device) bad(what + ": 'device_id' is missing");
  const std::uint64_t id = unsigned_param(*device, what + ": 'device_id'");
  r.device_id = static_cast<std::int64_t>(std::min<std::uint64_t>(id, INT64_MAX));
  const json* size = member(j, "byte_size");
  if (!size) bad(what + ": 'byte_size' is missing");
  r.byte_size = unsigned_param(*size, what + ": 'byte_size'");
  return r;
}

}  // namespace libreyolo::server::http
