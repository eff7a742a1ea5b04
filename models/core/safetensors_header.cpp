// Torch-free: compiled into libreyolo_models and, alone, into the libFuzzer target.
#include "models/core/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace libreyolo::models::core {
namespace {

struct DTypeName {
  const char* name;
  DType dtype;
  size_t size;
};

constexpr DTypeName kDTypes[] = {
    {"BOOL", DType::BOOL, 1}, {"U8", DType::U8, 1},           {"I8", DType::I8, 1},
    {"I16", DType::I16, 2},   {"U16", DType::U16, 2},         {"I32", DType::I32, 4},
    {"U32", DType::U32, 4},   {"I64", DType::I64, 8},         {"U64", DType::U64, 8},
    {"F16", DType::F16, 2},   {"BF16", DType::BF16, 2},       {"F32", DType::F32, 4},
    {"F64", DType::F64, 8},   {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
};

[[noreturn]] void fail(const std::string& file, const std::string& problem,
                       const std::string& key = {}) {
  std::ostringstream os;
  os << file << ": " << problem;
  if (!key.empty()) os << " (tensor '" << key << "')";
  throw CheckpointError(os.str());
}

// JSON dump of a value for messages, cut short and kept on one line.
std::string brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

uint64_t to_u64(const nlohmann::json& v, const std::string& file, const std::string& key,
                const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  fail(file, std::string(what) + " must be a non-negative integer, found " + brief(v), key);
}

}  // namespace

size_t itemsize(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

const char* dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (auto s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

const TensorInfo* Header::find(const std::string& key) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), key,
                             [](const TensorInfo& t, const std::string& k) { return t.key < k; });
  return it != tensors.end() && it->key == key ? &*it : nullptr;
}

Header parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& file) {
  if (size < 8)
    fail(file, "truncated safetensors file: " + std::to_string(size) +
                   " bytes, fewer than the 8-byte header length");
  // Little-endian u64 assembled from bytes: correct on any host byte order.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > size - 8)
    fail(file, "header length " + std::to_string(n) + " exceeds the file size " +
                   std::to_string(size) + " (truncated or not a safetensors file)");
  Header header;
  header.data_offset = 8 + n;
  header.data_size = size - header.data_offset;

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail(file, "header is not valid JSON: " + what);
  }
  if (!doc.is_object()) fail(file, "header is not a JSON object");

  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail(file, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) header.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    if (!v.is_object()) fail(file, "entry is not an object", key);
    TensorInfo t;
    t.key = key;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail(file, "missing or non-string 'dtype'", key);
    const auto name = dt->get<std::string>();
    bool known = false;
    for (const auto& d : kDTypes)
      if (name == d.name) t.dtype = d.dtype, known = true;
    if (!known) fail(file, "unknown dtype \"" + name.substr(0, 40) + "\"", key);

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail(file, "missing or non-array 'shape'", key);
    uint64_t numel = 1;
    const uint64_t limit = std::numeric_limits<uint64_t>::max() / 16;
    for (const auto& d : *sh) {
      uint64_t s = to_u64(d, file, key, "shape entry");
      if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(file, "shape entry too large", key);
      if (s != 0 && numel > limit / s) fail(file, "shape overflows", key);
      numel *= s;
      t.shape.push_back(static_cast<int64_t>(s));
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail(file, "missing 'data_offsets' [begin, end]", key);
    t.begin = to_u64((*off)[0], file, key, "data_offsets");
    t.end = to_u64((*off)[1], file, key, "data_offsets");
    if (t.begin > t.end)
      fail(file,
           "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
               "] has begin > end",
           key);
    if (t.end > header.data_size)
      fail(file,
           "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
               "] out of range: the data section has " + std::to_string(header.data_size) +
               " bytes",
           key);
    const uint64_t expected = numel * itemsize(t.dtype);
    if (t.end - t.begin != expected) {
      std::ostringstream os;
      os << "byte size " << (t.end - t.begin) << " does not match shape [";
      for (size_t i = 0; i < t.shape.size(); ++i) os << (i ? ", " : "") << t.shape[i];
      os << "] x " << name << " = " << expected << " bytes";
      fail(file, os.str(), key);
    }
    header.tensors.push_back(std::move(t));
  }

  // Overlap check on byte ranges (empty tensors occupy nothing).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : header.tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->key < b->key;
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail(file,
           "data of tensor '" + by_offset[i]->key + "' overlaps tensor '" + by_offset[i - 1]->key +
               "'",
           by_offset[i]->key);

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.key < b.key; });
  return header;
}

}  // namespace libreyolo::models::core
