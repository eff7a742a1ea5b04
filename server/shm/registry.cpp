// System regions: POSIX shm_open, then pread/pwrite on the kept descriptor (registry.h says
// why not mmap). CUDA regions (only with LIBREYOLO_SHM_CUDA, set by
// server/CMakeLists.txt when the build has CUDA): cudaIpcOpenMemHandle, sized through the
// driver's cuMemGetAddressRange, which is looked up with dlopen so that a CUDA build still
// starts on a machine without the driver (Triton does the same through
// cudaGetDriverEntryPoint: src/shared_memory_manager.cc).
#include "server/shm/registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifdef LIBREYOLO_SHM_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#endif

namespace libreyolo::server::shm {
namespace {

using api::Code;
using api::Error;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

/// Bytes the shm object behind `fd` holds now (0 when fstat fails).
std::uint64_t object_bytes(int fd) {
  struct ::stat st {};
  return ::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

#ifdef LIBREYOLO_SHM_CUDA
static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes, "CUDA_IPC_HANDLE_SIZE changed");

/// The size of the device allocation that contains `ptr` (cuMemGetAddressRange_v2 of the
/// driver API, CUresult (CUdeviceptr* base, size_t* size, CUdeviceptr ptr)); 0 when the driver
/// or the symbol is missing or the call fails.
std::size_t allocation_bytes(void* ptr) {
  using Fn = int (*)(unsigned long long*, std::size_t*, unsigned long long);
  static Fn fn = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    return lib ? reinterpret_cast<Fn>(::dlsym(lib, "cuMemGetAddressRange_v2")) : nullptr;
  }();
  if (!fn) return 0;
  unsigned long long base = 0;
  std::size_t size = 0;
  if (fn(&base, &size, reinterpret_cast<unsigned long long>(ptr)) != 0) return 0;
  // The region starts at `ptr`, possibly inside the allocation.
  const auto p = reinterpret_cast<unsigned long long>(ptr);
  return p >= base && p - base <= size ? size - static_cast<std::size_t>(p - base) : 0;
}
#endif

}  // namespace

Region::~Region() {
  if (kind_ == Kind::system) {
    if (fd_ >= 0) ::close(fd_);
  } else {
#ifdef LIBREYOLO_SHM_CUDA
    if (base_) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device_id_);
      cudaIpcCloseMemHandle(base_);
      cudaSetDevice(previous);
    }
#endif
  }
}

namespace {

/// Region::check_object_size's error: the object holds `now` bytes, fewer than the region's end.
Error shrunk(const Region& r, std::uint64_t now) {
  return Error(Code::invalid_argument, "shared memory region " + quoted(r.name()) + ": its key " +
                                           quoted(r.key()) + " now holds " + std::to_string(now) +
                                           " bytes, less than the offset + byte_size (" +
                                           std::to_string(r.offset() + r.byte_size()) +
                                           " bytes) it was registered with (register it again)");
}

}  // namespace

void Region::check_object_size() const {
  if (kind_ != Kind::system) return;
  const std::uint64_t now = object_bytes(fd_);
  if (now < offset_ + byte_size_) throw shrunk(*this, now);
}

void check_key(const std::string& name, const std::string& key) {
  const std::string prefix =
      "failed to register shared memory region " + quoted(name) + ": field 'key' ";
  if (key.find('\0') != std::string::npos) {
    throw Error(Code::invalid_argument,
                prefix + "contains a NUL byte at " + std::to_string(key.find('\0')));
  }
  // shm_open's "/name": one leading '/' is the POSIX spelling, the object is /dev/shm/name.
  const std::string object = !key.empty() && key[0] == '/' ? key.substr(1) : key;
  const char* why = object.empty()                          ? "names no object"
                    : object.find('/') != std::string::npos ? "has a '/' after the leading one"
                    : object == "." || object == ".."       ? "is a '.' or '..' component"
                                                            : nullptr;
  if (why) {
    throw Error(Code::invalid_argument,
                prefix + quoted(key) + " " + why +
                    " (expected \"/name\" or \"name\" of an object in /dev/shm)");
  }
}

Registry::~Registry() = default;

void Registry::check_new_name(const std::string& name) const {
  if (name.empty())
    throw Error(Code::invalid_argument,
                "a shared memory region needs a name (\"\" means every region to status and "
                "unregister)");
  if (regions_.count(name)) {
    throw Error(Code::already_exists,
                "shared memory region " + quoted(name) + " already in manager");
  }
  if (regions_.size() >= kMaxRegions)
    throw Error(Code::resource_exhausted,
                "too many shared memory regions: " + std::to_string(kMaxRegions) +
                    " are registered (unregister some first)");
}

bool Registry::cuda_built() {
#ifdef LIBREYOLO_SHM_CUDA
  return true;
#else
  return false;
#endif
}

void Registry::register_system(const std::string& name, const std::string& key,
                               std::uint64_t offset, std::uint64_t byte_size) {
  std::lock_guard<std::mutex> lk(mu_);
  check_new_name(name);
  check_key(name, key);
  const int fd = ::shm_open(key.c_str(), O_RDWR, S_IRUSR | S_IWUSR);
  if (fd < 0) {
    const int err = errno;
    // Triton answers INTERNAL for every failure; a key that names no object is the client's.
    throw Error(err == ENOENT ? Code::not_found : Code::internal,
                "Unable to open shared memory region: " + quoted(key) + ": " + std::strerror(err));
  }
  struct ::stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0 && st.st_size >= 0;
  const auto held = stat_ok ? static_cast<std::uint64_t>(st.st_size) : 0;
  const std::string prefix = "failed to register shared memory region " + quoted(name) + ": ";
  if (!stat_ok) {
    ::close(fd);
    throw Error(Code::internal, "Invalid shared memory region: " + quoted(key));
  }
  if (byte_size == 0 || offset > held || byte_size > held - offset) {
    ::close(fd);
    throw Error(Code::invalid_argument, prefix + "invalid args (offset " + std::to_string(offset) +
                                            " + byte_size " + std::to_string(byte_size) +
                                            " must be within the " + std::to_string(held) +
                                            " bytes of shared memory key " + quoted(key) +
                                            (byte_size == 0 ? ", and byte_size above 0)" : ")"));
  }
  auto r = std::shared_ptr<Region>(new Region());
  r->name_ = name;
  r->kind_ = Kind::system;
  r->key_ = key;
  r->offset_ = offset;
  r->byte_size_ = byte_size;
  r->fd_ = fd;  // kept: every use fstats, preads or pwrites it
  regions_.emplace(name, std::move(r));
}

void Registry::register_cuda(const std::string& name, std::string_view raw_handle,
                             std::int64_t device_id, std::uint64_t byte_size) {
  std::lock_guard<std::mutex> lk(mu_);
  check_new_name(name);
  if (raw_handle.size() != kCudaIpcHandleBytes) {
    throw Error(Code::invalid_argument,
                "failed to register CUDA shared memory region " + quoted(name) +
                    ": raw_handle has " + std::to_string(raw_handle.size()) + " bytes, expected " +
                    std::to_string(kCudaIpcHandleBytes) + " (a cudaIpcMemHandle_t)");
  }
#ifndef LIBREYOLO_SHM_CUDA
  (void)device_id;
  (void)byte_size;
  throw Error(Code::unavailable,
              "CUDA shared memory is not available: this libreyolo-server was built without CUDA");
#else
  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  if (count_err != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    throw Error(Code::unavailable,
                std::string("CUDA shared memory is not available: no CUDA device (") +
                    (count_err != cudaSuccess ? cudaGetErrorString(count_err) : "0 devices") + ")");
  }
  if (device_id < 0 || device_id >= devices) {
    throw Error(Code::invalid_argument, "failed to register CUDA shared memory region " +
                                            quoted(name) + ": device_id " +
                                            std::to_string(device_id) + " is not a CUDA device (" +
                                            std::to_string(devices) + " devices)");
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, raw_handle.data(), sizeof(handle));
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(static_cast<int>(device_id));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaSetDevice(previous);
    throw Error(Code::invalid_argument,
                std::string("failed to register shared memory region: invalid args "
                            "(cudaIpcOpenMemHandle: ") +
                    cudaGetErrorString(err) + ")");
  }
  const std::size_t available = allocation_bytes(ptr);
  if (byte_size == 0 || byte_size > available) {
    cudaIpcCloseMemHandle(ptr);
    cudaSetDevice(previous);
    throw Error(Code::invalid_argument,
                "failed to register shared memory region " + quoted(name) +
                    ": invalid args (byte_size " + std::to_string(byte_size) + " exceeds the " +
                    std::to_string(available) + " bytes of the CUDA allocation" +
                    (byte_size == 0 ? ", or is 0)" : ")"));
  }
  cudaSetDevice(previous);
  auto r = std::shared_ptr<Region>(new Region());
  r->name_ = name;
  r->kind_ = Kind::cuda;
  r->byte_size_ = byte_size;
  r->device_id_ = static_cast<int>(device_id);
  r->base_ = static_cast<char*>(ptr);
  regions_.emplace(name, std::move(r));
#endif
}

std::vector<SystemStatus> Registry::system_status(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<SystemStatus> out;
  auto add = [&](const Region& r) {
    out.push_back({r.name(), r.key(), r.offset(), r.byte_size()});
  };
  if (name.empty()) {
    for (const auto& [n, r] : regions_)
      if (r->kind() == Kind::system) add(*r);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end())
    throw Error(Code::not_found, "Unable to find system shared memory region: " + quoted(name));
  if (it->second->kind() != Kind::system) {
    throw Error(Code::not_found, "The region named " + quoted(name) +
                                     " is registered as CUDA shared memory, not system shared "
                                     "memory");
  }
  add(*it->second);
  return out;
}

std::vector<CudaStatus> Registry::cuda_status(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<CudaStatus> out;
  auto add = [&](const Region& r) {
    out.push_back({r.name(), static_cast<std::uint64_t>(r.device_id()), r.byte_size()});
  };
  if (name.empty()) {
    for (const auto& [n, r] : regions_)
      if (r->kind() == Kind::cuda) add(*r);
    return out;
  }
  auto it = regions_.find(name);
  if (it == regions_.end())
    throw Error(Code::not_found, "Unable to find cuda shared memory region: " + quoted(name));
  if (it->second->kind() != Kind::cuda) {
    throw Error(Code::not_found, "The region named " + quoted(name) +
                                     " is registered as system shared memory, not CUDA shared "
                                     "memory");
  }
  add(*it->second);
  return out;
}

int Registry::unregister(const std::string& name, Kind kind) {
  std::vector<std::shared_ptr<Region>> released;  // unmapped after the lock, when unused
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if ((name.empty() || it->first == name) && it->second->kind() == kind) {
        released.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(released.size());
}

int Registry::unregister_system(const std::string& name) { return unregister(name, Kind::system); }
int Registry::unregister_cuda(const std::string& name) { return unregister(name, Kind::cuda); }

View Registry::acquire(const std::string& name, std::uint64_t offset,
                       std::uint64_t byte_size) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end())
    throw Error(Code::not_found, "Unable to find shared memory region: " + quoted(name));
  const Region& r = *it->second;
  const std::string sizes = std::to_string(r.byte_size()) + " bytes";
  if (offset >= r.byte_size()) {
    throw Error(Code::invalid_argument, "Invalid offset for shared memory region: " + quoted(name) +
                                            " (offset " + std::to_string(offset) + ", region of " +
                                            sizes + ")");
  }
  if (byte_size > r.byte_size() - offset) {
    throw Error(Code::invalid_argument,
                "Invalid offset + byte size for shared memory region: " + quoted(name) +
                    " (offset " + std::to_string(offset) + " + byte_size " +
                    std::to_string(byte_size) + " > " + sizes + ")");
  }
  r.check_object_size();
  View v;
  v.region = it->second;
  if (r.kind() == Kind::cuda) v.data = r.base() + offset;
  v.object_offset = r.offset() + offset;
  v.byte_size = byte_size;
  return v;
}

std::string read(const View& view) {
  const Region* r = view.region.get();
  if (!r || r->kind() != Kind::system) {
    throw Error(Code::internal, "cannot read shared memory region " + quoted(r ? r->name() : "") +
                                    " on the host: it is CUDA shared memory");
  }
  std::string out(static_cast<std::size_t>(view.byte_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::pread(r->fd_, out.data() + done, out.size() - done,
                                static_cast<off_t>(view.object_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(Code::internal, "cannot read shared memory region " + quoted(r->name()) + ": " +
                                      std::strerror(errno));
    }
    if (n == 0) throw shrunk(*r, object_bytes(r->fd_));  // end of the object: it shrank
    done += static_cast<std::size_t>(n);
  }
  return out;
}

void write(const View& view, const void* src, std::size_t bytes) {
  if (bytes > view.byte_size) {
    throw Error(Code::invalid_argument, std::to_string(bytes) + " bytes do not fit the " +
                                            std::to_string(view.byte_size) +
                                            " bytes of shared memory region " +
                                            quoted(view.region ? view.region->name() : ""));
  }
  if (bytes == 0) return;
  if (!view.on_device()) {
    const Region& r = *view.region;
    r.check_object_size();
    // A shrink after this check makes pwrite grow the object back (zeros before our bytes),
    // which the client that shrank it sees; never a fault.
    const char* p = static_cast<const char*>(src);
    std::size_t done = 0;
    while (done < bytes) {
      const ::ssize_t n =
          ::pwrite(r.fd_, p + done, bytes - done, static_cast<off_t>(view.object_offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw Error(Code::internal, "cannot write shared memory region " + quoted(r.name()) + ": " +
                                        std::strerror(n < 0 ? errno : EIO));
      }
      done += static_cast<std::size_t>(n);
    }
    return;
  }
#ifdef LIBREYOLO_SHM_CUDA
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(view.region->device_id());
  const cudaError_t err = cudaMemcpy(view.data, src, bytes, cudaMemcpyHostToDevice);
  cudaSetDevice(previous);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(Code::internal, "cannot write CUDA shared memory region " +
                                    quoted(view.region->name()) + ": " + cudaGetErrorString(err));
  }
#endif
}

}  // namespace libreyolo::server::shm
