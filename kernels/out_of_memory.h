// A kernel implementation that runs out of memory (docs/DESIGN.md "Kernel registry"): the
// first time in a row is transient, the memory may be free again a moment later. The Handle
// call then throws OutOfMemory (the request fails, the server answers RESOURCE_EXHAUSTED and the
// client may retry) instead of disabling the implementation and falling back; a second
// out-of-memory in a row (no successful call of that implementation in between) disables it
// like any runtime failure (one warning, one fallback event). Implemented in registry.cpp (the
// call path: detail::fail, detail::count_call).
//
// Its own header, not slot.h or registry.h: no torch, and nothing that every model includes.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels {

class Registry;

/// Thrown by a Handle call whose implementation ran out of memory (is_out_of_memory) for the
/// first time since its last successful call; the implementation stays enabled and no other
/// candidate runs. what(): "kernel SLOT/IMPL ran out of memory: <the first line of the
/// implementation's error>" (a c10::Error's backtrace follows its first line).
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(const std::string& slot, const std::string& impl, const std::string& error);
  const std::string& slot() const { return slot_; }
  const std::string& impl() const { return impl_; }

 private:
  std::string slot_, impl_;
};

/// True for an allocation failure: a c10::OutOfMemoryError (recognised by its type name, so
/// that the registry needs no torch) or any exception whose message says "out of memory" (the
/// CUDA caching allocator's "CUDA out of memory. Tried to allocate ...", CUDA's
/// cudaErrorMemoryAllocation "out of memory").
bool is_out_of_memory(const std::exception& e);

/// Out-of-memory failures of `impl` of `slot` in `registry` so far, transient or disabling
/// (libreyolo_kernel_oom_total).
std::uint64_t out_of_memory_count(const Registry& registry, const std::string& slot,
                                  const std::string& impl);

}  // namespace libreyolo::kernels
