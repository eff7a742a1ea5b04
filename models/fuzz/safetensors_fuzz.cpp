// libFuzzer target for the torch-free safetensors header parser
// (models/core/safetensors_header.cpp). Any input must either parse into a header whose
// invariants hold or throw CheckpointError; crashes, sanitizer reports and other exceptions
// are bugs. Seed corpus: tests/fixtures/fuzz/safetensors/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "models/core/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::models::core;
  try {
    const Header h = parse_safetensors_header(data, size, "fuzz.safetensors");
    if (h.data_offset + h.data_size != size) std::abort();
    uint64_t previous_end = 0;
    const TensorInfo* previous = nullptr;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_size) std::abort();
      if (t.end - t.begin != t.numel() * itemsize(t.dtype)) std::abort();
      if (previous && !(previous->key < t.key)) std::abort();  // sorted, unique
      if (h.find(t.key) != &t) std::abort();
      previous = &t;
      previous_end = t.end;
    }
    (void)previous_end;
  } catch (const CheckpointError&) {
    // expected for malformed input
  }
  return 0;
}
