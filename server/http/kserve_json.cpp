// KServe v2 REST codec (see kserve_json.h). Request layout and the binary extension follow
// kserve/open-inference-protocol docs/specification (REST) and triton-inference-server/server
// docs/protocol/extension_binary_data.md.
#include "server/http/kserve_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <variant>

namespace libreyolo::server::http {
namespace {

using api::Code;
using api::Error;
using nlohmann::json;

/// Same clip as server/rpc/grpc_server.cpp: echoed names (inputs, outputs) stay bounded.
constexpr std::size_t kMaxMessageBytes = 2048;

[[noreturn]] void bad(const std::string& message) { throw Error(Code::invalid_argument, message); }

/// A name for messages: up to 64 bytes whole, else the first 48 and the length (the rule of
/// server/repository/model_name.h quoted_name, which this torch-free library cannot include).
std::string quote_name(const std::string& name) {
  if (name.size() <= 64) return "'" + name + "'";
  return "'" + name.substr(0, 48) + "...' (" + std::to_string(name.size()) + " bytes)";
}

std::string type_name(const json& j) { return j.type_name(); }

/// A client's value as an error message shows it: a scalar as JSON (48 characters at most), an
/// array or object by its type only. Never dump a client's structure: json::dump recurses once
/// per nesting level (a 60,000-deep array overflowed the worker stack; found by breaking the
/// daemon from outside).
std::string preview(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  return v.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 48);
}

/// Deepest JSON nesting a request may use: KServe's nested `data` arrays follow the shape's rank
/// (at most 8 dimensions here), plus the document's own levels.
constexpr int kMaxJsonDepth = 32;

/// Most JSON values (numbers, strings, ... each counted once) one document may hold: 4 Mi, one
/// 3 x 800 x 1333 image as JSON numbers (Deformable DETR's input) with room. Each parsed value
/// costs 16 bytes of DOM plus its array's slack, so a 64 MiB body of "0," (32 M values) would
/// otherwise become about 1 GB per request, times server.http_threads; larger tensors go in the
/// binary tensor extension or shared memory.
constexpr std::int64_t kMaxJsonValues = std::int64_t{1} << 22;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Product of the dimensions; throws when it exceeds 2^62 (no real tensor is that large, and the
/// byte count computed from it must not overflow).
std::uint64_t element_count(const std::vector<std::int64_t>& shape, const std::string& what) {
  std::uint64_t n = 1;
  for (const auto d : shape) {
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > (std::uint64_t{1} << 62) / u)
      bad(what + ": shape " + shape_text(shape) + " has too many elements");
    n *= u;
  }
  return n;
}

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

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as grpc_server.cpp
  out.append(b, sizeof(T));
}

template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
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

const json* member(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string string_member(const json& object, const char* key, const std::string& what) {
  const json* v = member(object, key);
  if (!v) bad(what + ": '" + key + "' is missing");
  if (!v->is_string()) bad(what + ": '" + key + "' must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

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

json parse_json(std::string_view text, const char* what) {
  try {
    // The depth is bounded while parsing, before a deep document exists: everything that
    // walks a json (dump, the destructor) may recurse per level.
    // The value count is bounded the same way: refused before the DOM holds more.
    std::int64_t values = 0;
    return json::parse(text.begin(), text.end(),
                       [&values](int depth, json::parse_event_t event, json&) {
                         if (depth > kMaxJsonDepth) throw std::length_error("too deep");
                         if (event == json::parse_event_t::value && ++values > kMaxJsonValues)
                           throw std::range_error("too many values");
                         return true;
                       });
  } catch (const std::length_error&) {
    bad(std::string(what) + " nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const std::range_error&) {
    bad(std::string(what) + " holds more than " + std::to_string(kMaxJsonValues) +
        " JSON values; send large tensors in binary (Inference-Header-Content-Length) or "
        "through shared memory");
  } catch (
      const json::exception& e) {  // parse_error, and out_of_range for 1e999 (found by fuzzing)
    bad(std::string(what) + " is not valid JSON: " + e.what());
  }
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

json tensor_json(const api::TensorMetadata& t) {
  return {{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// The JSON `data` of one output (flat, row-major).
json output_data(const api::OutputTensor& t, std::uint64_t count) {
  const std::string& d = t.data;
  const std::size_t size = element_size(t.datatype);
  json out = json::array();
  auto internal = [&](const std::string& m) {
    throw Error(Code::internal, "output " + quote_name(t.name) + ": " + m);
  };
  if (t.datatype == "BYTES") {
    std::size_t at = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      if (d.size() - at < 4) internal("BYTES data ends inside element " + std::to_string(i));
      const auto n = get<std::uint32_t>(d.data() + at);
      at += 4;
      if (d.size() - at < n) internal("BYTES data ends inside element " + std::to_string(i));
      out.push_back(d.substr(at, n));
      at += n;
    }
    if (at != d.size()) internal("BYTES data is longer than its shape");
    return out;
  }
  if (size == 0) internal("unknown datatype " + t.datatype);
  if (d.size() % size != 0 || d.size() / size != count)
    internal(std::to_string(d.size()) + " bytes for shape " + shape_text(t.shape) + " of " +
             t.datatype);
  const char* p = d.data();
  for (std::uint64_t i = 0; i < count; ++i, p += size) {
    const std::string& dt = t.datatype;
    if (dt == "FP32") {
      out.push_back(static_cast<double>(get<float>(p)));
    } else if (dt == "FP64") {
      out.push_back(get<double>(p));
    } else if (dt == "FP16") {
      out.push_back(static_cast<double>(half_to_float(get<std::uint16_t>(p))));
    } else if (dt == "BF16") {
      out.push_back(static_cast<double>(bfloat16_to_float(get<std::uint16_t>(p))));
    } else if (dt == "INT64") {
      out.push_back(get<std::int64_t>(p));
    } else if (dt == "INT32") {
      out.push_back(get<std::int32_t>(p));
    } else if (dt == "INT16") {
      out.push_back(get<std::int16_t>(p));
    } else if (dt == "INT8") {
      out.push_back(get<std::int8_t>(p));
    } else if (dt == "UINT64") {
      out.push_back(get<std::uint64_t>(p));
    } else if (dt == "UINT32") {
      out.push_back(get<std::uint32_t>(p));
    } else if (dt == "UINT16") {
      out.push_back(get<std::uint16_t>(p));
    } else if (dt == "UINT8") {
      out.push_back(get<std::uint8_t>(p));
    } else {  // BOOL
      out.push_back(*p != 0);
    }
  }
  return out;
}

std::string config_type(const std::string& dt) {
  return dt == "BYTES" ? "TYPE_STRING" : "TYPE_" + dt;
}

json duration_json(const api::Duration& d) { return {{"count", d.count}, {"ns", d.ns}}; }

}  // namespace

bool OutputFormat::is_binary(const std::string& output) const {
  const auto it = binary.find(output);
  return it == binary.end() ? binary_default : it->second;
}

std::size_t element_size(std::string_view dt) {
  if (dt == "BOOL" || dt == "UINT8" || dt == "INT8") return 1;
  if (dt == "UINT16" || dt == "INT16" || dt == "FP16" || dt == "BF16") return 2;
  if (dt == "UINT32" || dt == "INT32" || dt == "FP32") return 4;
  if (dt == "UINT64" || dt == "INT64" || dt == "FP64") return 8;
  return 0;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mant = x & 0x7fffffu;
  const int exp = static_cast<int>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = exp - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (e <= 0) {                                                    // subnormal or zero
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(h);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --e;
      }
      mant &= 0x3ffu;
      bits = sign | (static_cast<std::uint32_t>(e + 112) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

float bfloat16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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

RenderedBody render_infer_response(const api::InferResponse& response, const OutputFormat& format) {
  json j = {{"model_name", response.model_name}, {"model_version", response.model_version}};
  if (!response.id.empty()) j["id"] = response.id;
  json outputs = json::array();
  std::string binary;
  bool any_binary = false;
  for (const auto& t : response.outputs) {
    json o = {{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}};
    if (const auto it = format.in_shm.find(t.name); it != format.in_shm.end()) {
      // Written into shared memory: the parameters name the region, no data (Triton).
      json params = json::object();
      for (const auto& [key, value] : it->second)
        std::visit([&, k = key](const auto& v) { params[k] = v; }, value);
      o["parameters"] = std::move(params);
      outputs.push_back(std::move(o));
      continue;
    }
    // Saturating: a shape whose product overflows matches no data (output_data refuses it).
    std::uint64_t count = 1;
    for (const auto d : t.shape) {
      const auto u = static_cast<std::uint64_t>(d < 0 ? 0 : d);
      count = u != 0 && count > UINT64_MAX / u ? UINT64_MAX : count * u;
    }
    if (format.is_binary(t.name)) {
      o["parameters"] = {{"binary_data_size", t.data.size()}};
      binary += t.data;
      any_binary = true;
    } else {
      o["data"] = output_data(t, count);
    }
    outputs.push_back(std::move(o));
  }
  j["outputs"] = std::move(outputs);
  RenderedBody out;
  out.body = dump(j);
  if (any_binary) {
    out.header_length = out.body.size();
    out.body += binary;
  }
  return out;
}

std::string render_server_metadata(const api::ServerMetadata& m) {
  return dump({{"name", m.name}, {"version", m.version}, {"extensions", m.extensions}});
}

std::string render_model_metadata(const api::ModelMetadata& m) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : m.inputs) inputs.push_back(tensor_json(t));
  for (const auto& t : m.outputs) outputs.push_back(tensor_json(t));
  return dump({{"name", m.name},
               {"versions", m.versions},
               {"platform", m.platform},
               {"inputs", inputs},
               {"outputs", outputs}});
}

std::string render_model_config(const api::ModelConfig& c) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : c.inputs)
    inputs.push_back({{"name", t.name},
                      {"data_type", config_type(t.datatype)},
                      {"dims", t.shape},
                      {"optional", t.optional}});
  for (const auto& t : c.outputs)
    outputs.push_back(
        {{"name", t.name}, {"data_type", config_type(t.datatype)}, {"dims", t.shape}});
  json params = json::object();
  for (const auto& [k, v] : c.parameters) params[k] = {{"string_value", v}};
  json groups = json::array();
  for (const auto& g : c.instance_group)
    groups.push_back({{"name", g.name}, {"kind", g.kind}, {"count", g.count}, {"gpus", g.gpus}});
  return dump({{"name", c.name},
               {"platform", c.platform},
               {"backend", c.backend},
               {"max_batch_size", c.max_batch_size},
               {"input", inputs},
               {"output", outputs},
               {"instance_group", groups},
               {"dynamic_batching",
                {{"max_queue_delay_microseconds", c.max_queue_delay_microseconds},
                 {"default_queue_policy",
                  {{"max_queue_size", c.max_queue_size},
                   {"default_timeout_microseconds", c.default_timeout_microseconds}}}}},
               {"parameters", params}});
}

std::string render_statistics(const std::vector<api::ModelStatistics>& stats) {
  json models = json::array();
  for (const auto& s : stats) {
    json batches = json::array();
    for (const auto& b : s.batch_stats)
      batches.push_back({{"batch_size", b.batch_size},
                         {"compute_input", duration_json(b.compute_input)},
                         {"compute_infer", duration_json(b.compute_infer)},
                         {"compute_output", duration_json(b.compute_output)}});
    models.push_back({{"name", s.name},
                      {"version", s.version},
                      {"last_inference", s.last_inference_ms},
                      {"inference_count", s.inference_count},
                      {"execution_count", s.execution_count},
                      {"inference_stats",
                       {{"success", duration_json(s.success)},
                        {"fail", duration_json(s.fail)},
                        {"queue", duration_json(s.queue)},
                        {"compute_input", duration_json(s.compute_input)},
                        {"compute_infer", duration_json(s.compute_infer)},
                        {"compute_output", duration_json(s.compute_output)}}},
                      {"batch_stats", batches}});
  }
  return dump({{"model_stats", models}});
}

std::string render_repository_index(const std::vector<api::RepositoryEntry>& entries) {
  json out = json::array();
  for (const auto& e : entries)
    out.push_back(
        {{"name", e.name}, {"version", e.version}, {"state", e.state}, {"reason", e.reason}});
  return dump(out);
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

std::string render_system_status(const std::vector<shm::SystemStatus>& regions) {
  json out = json::array();
  for (const auto& r : regions)
    out.push_back(
        {{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.byte_size}});
  return dump(out);
}

std::string render_cuda_status(const std::vector<shm::CudaStatus>& regions) {
  json out = json::array();
  for (const auto& r : regions)
    out.push_back({{"name", r.name}, {"device_id", r.device_id}, {"byte_size", r.byte_size}});
  return dump(out);
}

std::string render_error(const std::string& message) {
  std::string m = message;
  if (m.size() > kMaxMessageBytes) {
    const std::size_t total = m.size();
    m.resize(kMaxMessageBytes);
    m += "... (" + std::to_string(total) + " bytes, clipped)";
  }
  return dump({{"error", m}});
}

int http_status(api::Code code) {
  switch (code) {
    case Code::ok:
      return 200;
    case Code::not_found:
      return 404;
    case Code::unavailable:
      return 503;
    case Code::internal:
      return 500;
    case Code::unimplemented:
      return 501;
    case Code::deadline_exceeded:
      return 504;
    case Code::resource_exhausted:
      return 429;
    case Code::permission_denied:
      return 403;
    case Code::cancelled:
    case Code::unknown:
    case Code::already_exists:  // Triton: a region registered twice is 400 (HttpCodeFromError)
    case Code::invalid_argument:
    case Code::failed_precondition:
      return 400;
  }
  return 400;
}

}  // namespace libreyolo::server::http
