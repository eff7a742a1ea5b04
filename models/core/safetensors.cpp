#include "models/core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace libreyolo::models::core {

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

namespace {

bool host_is_little_endian() {
  const uint16_t one = 1;
  uint8_t first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

}  // namespace

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::BOOL:
      return at::kBool;
    case DType::U8:
      return at::kByte;
    case DType::I8:
      return at::kChar;
    case DType::I16:
      return at::kShort;
    case DType::U16:
      return at::kUInt16;
    case DType::I32:
      return at::kInt;
    case DType::U32:
      return at::kUInt32;
    case DType::I64:
      return at::kLong;
    case DType::U64:
      return at::kUInt64;
    case DType::F16:
      return at::kHalf;
    case DType::BF16:
      return at::kBFloat16;
    case DType::F32:
      return at::kFloat;
    case DType::F64:
      return at::kDouble;
    case DType::F8_E4M3:
      return at::kFloat8_e4m3fn;
    case DType::F8_E5M2:
      return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CheckpointError(path + ": not a regular file");
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    mapping->addr = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping->addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw CheckpointError(path + ": mmap failed: " + std::strerror(err));
    }
  }
  ::close(fd);  // the mapping stays valid
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->header_ =
      parse_safetensors_header(static_cast<const uint8_t*>(mapping->addr), mapping->size, path);
  file->mapping_ = std::move(mapping);
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> out;
  out.reserve(header_.tensors.size());
  for (const auto& t : header_.tensors) out.push_back(t.key);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  const TensorInfo* t = header_.find(key);
  if (t == nullptr) throw CheckpointError(path_ + ": missing tensor (tensor '" + key + "')");
  return *t;
}

at::Tensor SafetensorsFile::view(const std::string& key) const {
  const TensorInfo& t = info(key);
  const auto type = to_scalar_type(t.dtype);
  const auto opts = at::TensorOptions().dtype(type).device(at::kCPU);
  if (t.end == t.begin) return at::empty(t.shape, opts);
  auto* data = static_cast<uint8_t*>(mapping_->addr) + header_.data_offset + t.begin;
  const size_t isz = itemsize(t.dtype);
  // Unaligned data (a header length not padded to the element size) or a big-endian host:
  // a copy, which keeps every later ATen kernel on aligned, native-order memory.
  const bool aligned = reinterpret_cast<uintptr_t>(data) % isz == 0;
  if (!aligned || (!host_is_little_endian() && isz > 1)) {
    at::Tensor out = at::empty(t.shape, opts);
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    const size_t bytes = t.end - t.begin;
    if (host_is_little_endian()) {
      std::memcpy(dst, data, bytes);
    } else {
      for (size_t i = 0; i < bytes; i += isz)
        for (size_t b = 0; b < isz; ++b) dst[i + b] = data[i + isz - 1 - b];
    }
    return out;
  }
  std::shared_ptr<Mapping> keep = mapping_;
  return at::from_blob(
      data, t.shape, [keep](void*) mutable { keep.reset(); }, opts);
}

at::Tensor SafetensorsFile::get(const std::string& key, at::ScalarType dtype,
                                const at::Device& device) const {
  return view(key).to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace libreyolo::models::core
