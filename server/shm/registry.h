// Shared-memory regions registered by clients (Triton's system and CUDA shared-memory
// extensions), for every transport: gRPC (server/grpc/grpc_server.cpp) and REST call the same
// Registry. No torch, no gRPC, no protobuf here: names, keys, sizes and api::Error only.
//
// Semantics follow triton-inference-server/server src/shared_memory_manager.cc (register,
// status, unregister, the bounds of a use) and its status messages; where this registry says
// more (the numbers of a failed bounds check) the text starts with Triton's message.
//
// Life cycle: a Region is shared (std::shared_ptr) by the registry and by every request that
// uses it (a View). Unregister takes the name out of the registry at once (status no longer
// lists it, the name can be registered again) and the region itself (close of the descriptor /
// cudaIpcCloseMemHandle) is released when the last View of it goes: an unregister while a
// request uses the region is deferred, never refused, and never closes under a request.
//
// System regions are never mapped: every access is pread/pwrite on the descriptor kept open
// since registration (read, write). The client owns the object and may shrink it (ftruncate)
// at any moment, also between a size check and the copy; a mapping touched past the object's
// end is SIGBUS for the whole daemon, while pread/pwrite return a short count or grow the
// object instead. A SIGBUS guard (sigsetjmp in a thread-local handler) would have to cover
// every reader of the bytes (decoders included), and jumping out of library code is unsafe;
// the cost of pread is one copy of an input's bytes, which the core made anyway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/types.h"

namespace libreyolo::server::shm {

/// Bytes of a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE in driver_types.h): the size a
/// CudaSharedMemoryRegister raw_handle must have.
constexpr std::size_t kCudaIpcHandleBytes = 64;

enum class Kind { system, cuda };

/// Regions one server holds at most (system and CUDA together). Each is a mapping and, for a
/// system region, an open descriptor: unbounded, a client could exhaust the process's mappings
/// (vm.max_map_count) and descriptors, and every inference would then fail.
constexpr std::size_t kMaxRegions = 1024;

struct View;

/// One registered region. Immutable after registration; the destructor closes or unmaps it.
class Region {
 public:
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& name() const { return name_; }
  Kind kind() const { return kind_; }
  const std::string& key() const { return key_; }   ///< system: the POSIX shm key
  std::uint64_t offset() const { return offset_; }  ///< system: offset into the shm object
  std::uint64_t byte_size() const { return byte_size_; }
  int device_id() const { return device_id_; }  ///< cuda: the device it lives on
  /// cuda: the device pointer cudaIpcOpenMemHandle returned (the region's first byte).
  /// system: nullptr (system regions are read and written through the descriptor: read, write).
  char* base() const { return base_; }
  /// System: throws api::Error INVALID_ARGUMENT "shared memory region 'NAME': its key 'KEY'
  /// now holds N bytes, less than the offset + byte_size (M bytes) it was registered with
  /// (register it again)" when the client shrank the object (ftruncate) since registration:
  /// touching the mapping past the object's end would be SIGBUS. CUDA: nothing to check.
  void check_object_size() const;

 private:
  friend class Registry;
  Region() = default;
  std::string name_;
  Kind kind_ = Kind::system;
  std::string key_;
  std::uint64_t offset_ = 0, byte_size_ = 0;
  int device_id_ = 0;
  char* base_ = nullptr;
  int fd_ = -1;  ///< system: the shm object, kept open: fstat, pread and pwrite at every use
  friend std::string read(const View& view);
  friend void write(const View& view, const void* src, std::size_t bytes);
};

/// [offset, offset + byte_size) of a region, for one request. Holding it keeps the region
/// (its descriptor or its CUDA mapping).
struct View {
  std::shared_ptr<const Region> region;
  char* data = nullptr;  ///< cuda: the device pointer; system: nullptr (use read / write)
  std::uint64_t object_offset = 0;  ///< system: where the view starts in the shm object
  std::uint64_t byte_size = 0;
  bool on_device() const { return region && region->kind() == Kind::cuda; }
};

/// The bytes of a system view, copied with pread on the region's descriptor (see the file
/// comment: never from a mapping). Throws api::Error INVALID_ARGUMENT with
/// Region::check_object_size's message when the object holds fewer bytes than the view needs
/// (also when it shrank during the copy); INTERNAL "cannot read shared memory region 'NAME':
/// <strerror>" when pread fails, or for a CUDA view (its bytes are read on the device).
std::string read(const View& view);

/// Copies `bytes` bytes from host memory `src` into the view (pwrite on the descriptor, or
/// cudaMemcpy for a CUDA region). Throws api::Error INVALID_ARGUMENT when they do not fit (the
/// caller checks first with its own message) or the object shrank (Region::check_object_size,
/// checked just before the copy; one shrunk in between is grown back by pwrite, never a
/// fault); INTERNAL when pwrite or the CUDA copy fails.
void write(const View& view, const void* src, std::size_t bytes);

struct SystemStatus {
  std::string name, key;
  std::uint64_t offset = 0, byte_size = 0;
};

struct CudaStatus {
  std::string name;
  std::uint64_t device_id = 0, byte_size = 0;
};

/// Throws api::Error INVALID_ARGUMENT "failed to register shared memory region 'NAME': field
/// 'key' <why>" unless `key` names an object in /dev/shm as shm_open expects: "/name" or
/// "name", not empty, no NUL byte, no '/' after the leading one, not "." or ".." (a key such as
/// "/../x" or "a/b" would leave /dev/shm, or, with a NUL, shm_open would open another name).
void check_key(const std::string& name, const std::string& key);

/// The regions of one server. Thread-safe. Every method throws api::Error (code and Triton's
/// message) on a bad argument; nothing else escapes.
class Registry {
 public:
  Registry() = default;
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// SystemSharedMemoryRegister: shm_open(key, O_RDWR) of [offset, offset + byte_size), the
  /// descriptor kept (not mapped: see the file comment). Errors (both kinds): INVALID_ARGUMENT
  /// for an empty name; ALREADY_EXISTS "shared memory region 'NAME' already in manager";
  /// RESOURCE_EXHAUSTED "too many shared memory regions: 1024 are registered (unregister some
  /// first)". System only: INVALID_ARGUMENT "failed to register shared memory region 'NAME':
  /// field 'key' <why>" when the key is not the name of an object in /dev/shm (check_key);
  /// NOT_FOUND "Unable to open shared memory region: 'KEY': No such file or directory" when no
  /// object has that key, INTERNAL "Unable to open shared memory region: 'KEY': <strerror>" when
  /// shm_open fails otherwise; INVALID_ARGUMENT "failed to register shared memory region 'NAME':
  /// invalid args (...)" when byte_size is 0 or offset + byte_size exceeds the object's size
  /// (fstat).
  void register_system(const std::string& name, const std::string& key, std::uint64_t offset,
                       std::uint64_t byte_size);

  /// CudaSharedMemoryRegister: cudaIpcOpenMemHandle(raw_handle) on device_id, bounds checked
  /// with cuMemGetAddressRange (the allocation the handle names must hold byte_size bytes).
  /// Errors: ALREADY_EXISTS (as above); INVALID_ARGUMENT "failed to register CUDA shared memory
  /// region 'NAME': raw_handle has N bytes, expected 64 (a cudaIpcMemHandle_t)"; UNAVAILABLE
  /// "CUDA shared memory is not available: <why>" (a build without CUDA, no CUDA device);
  /// INVALID_ARGUMENT "failed to register CUDA shared memory region 'NAME': device_id D is not
  /// a CUDA device (N devices)"; INVALID_ARGUMENT "failed to register shared memory region:
  /// invalid args (cudaIpcOpenMemHandle: <cuda error>)"; INVALID_ARGUMENT "failed to register
  /// shared memory region 'NAME': invalid args (byte_size B exceeds the A bytes of the CUDA
  /// allocation)".
  void register_cuda(const std::string& name, std::string_view raw_handle, std::int64_t device_id,
                     std::uint64_t byte_size);

  /// SystemSharedMemoryStatus / CudaSharedMemoryStatus: every region of that kind when `name`
  /// is empty (sorted by name), else that one. Errors: NOT_FOUND "Unable to find system shared
  /// memory region: 'NAME'" / "Unable to find cuda shared memory region: 'NAME'"; NOT_FOUND
  /// "The region named 'NAME' is registered as CUDA shared memory, not system shared memory"
  /// (and the converse).
  std::vector<SystemStatus> system_status(const std::string& name) const;
  std::vector<CudaStatus> cuda_status(const std::string& name) const;

  /// SystemSharedMemoryUnregister / CudaSharedMemoryUnregister: `name` empty = every region of
  /// that kind. An unknown name, or one of the other kind, is not an error (Triton). Returns the
  /// number of regions taken out of the registry; those used by a request are unmapped when
  /// the request ends (see the file comment).
  int unregister_system(const std::string& name);
  int unregister_cuda(const std::string& name);

  /// The bytes [offset, offset + byte_size) of region `name` for one request. Errors:
  /// NOT_FOUND "Unable to find shared memory region: 'NAME'"; INVALID_ARGUMENT "Invalid offset
  /// for shared memory region: 'NAME' (offset O, region of S bytes)"; INVALID_ARGUMENT "Invalid
  /// offset + byte size for shared memory region: 'NAME' (offset O + byte_size B > S bytes)";
  /// Region::check_object_size's error when the client shrank the object.
  View acquire(const std::string& name, std::uint64_t offset, std::uint64_t byte_size) const;

  /// True when this build can open CUDA IPC handles (compiled with CUDA); a device may still be
  /// missing at run time.
  static bool cuda_built();

 private:
  int unregister(const std::string& name, Kind kind);
  /// Throws unless `name` may be registered now (mu_ held).
  void check_new_name(const std::string& name) const;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_;
};

}  // namespace libreyolo::server::shm
