// What the KServe v2 REST codec's request parsing (kserve_request.cpp) and response writing
// (kserve_response.cpp) share: JSON parsing with its limits, how a client's value and names
// appear in messages, raw little-endian element access. Internal to server/http/.
#pragma once

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/types.h"

namespace libreyolo::server::http {
namespace kserve_detail {

using api::Code;
using api::Error;
using nlohmann::json;

/// Same clip as server/grpc/grpc_server.cpp: echoed names (inputs, outputs) stay bounded.
inline constexpr std::size_t kMaxMessageBytes = 2048;

[[noreturn]] inline void bad(const std::string& message) {
  throw Error(Code::invalid_argument, message);
}

/// A name for messages: up to 64 bytes whole, else the first 48 and the length (the rule of
/// server/repository/model_name.h quoted_name, which this torch-free library cannot include).
inline std::string quote_name(const std::string& name) {
  if (name.size() <= 64) return "'" + name + "'";
  return "'" + name.substr(0, 48) + "...' (" + std::to_string(name.size()) + " bytes)";
}

inline std::string type_name(const json& j) { return j.type_name(); }

/// A client's value as an error message shows it: a scalar as JSON (48 characters at most), an
/// array or object by its type only. Never dump a client's structure: json::dump recurses once
/// per nesting level (a 60,000-deep array overflowed the worker stack; found by breaking the
/// daemon from outside).
inline std::string preview(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  return v.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 48);
}

/// Deepest JSON nesting a request may use: KServe's nested `data` arrays follow the shape's rank
/// (at most 8 dimensions here), plus the document's own levels.
inline constexpr int kMaxJsonDepth = 32;

/// Most JSON values (numbers, strings, ... each counted once) one document may hold: 4 Mi, one
/// 3 x 800 x 1333 image as JSON numbers (Deformable DETR's input) with room. Each parsed value
/// costs 16 bytes of DOM plus its array's slack, so a 64 MiB body of "0," (32 M values) would
/// otherwise become about 1 GB per request, times server.http_threads; larger tensors go in the
/// binary tensor extension or shared memory.
inline constexpr std::int64_t kMaxJsonValues = std::int64_t{1} << 22;

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Product of the dimensions; throws when it exceeds 2^62 (no real tensor is that large, and the
/// byte count computed from it must not overflow).
inline std::uint64_t element_count(const std::vector<std::int64_t>& shape,
                                   const std::string& what) {
  std::uint64_t n = 1;
  for (const auto d : shape) {
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > (std::uint64_t{1} << 62) / u)
      bad(what + ": shape " + shape_text(shape) + " has too many elements");
    n *= u;
  }
  return n;
}

template <class T>
inline void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as grpc_server.cpp
  out.append(b, sizeof(T));
}

template <class T>
inline T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline const json* member(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

inline std::string string_member(const json& object, const char* key, const std::string& what) {
  const json* v = member(object, key);
  if (!v) bad(what + ": '" + key + "' is missing");
  if (!v->is_string()) bad(what + ": '" + key + "' must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

inline json parse_json(std::string_view text, const char* what) {
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

inline std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kserve_detail
}  // namespace libreyolo::server::http
