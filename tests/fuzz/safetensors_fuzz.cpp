// libFuzzer target for the torch-free safetensors header parser
// (models/core/safetensors_header.cpp). Any input must either parse into a header whose
// invariants hold or throw CheckpointError; crashes, sanitizer reports and other exceptions
// are bugs. Seed corpus: tests/fuzz/corpus/safetensors/.
#include <cstddef>
#include <cstdint>

#include "models/core/safetensors_header.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::models::core;
  using libreyolo::fuzz::fail;
  try {
    const Header h = parse_safetensors_header(data, size, "fuzz.safetensors");
    if (h.data_offset + h.data_size != size) fail("data section size");
    const TensorInfo* previous = nullptr;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_size) fail("offsets outside the data section");
      if (t.end - t.begin != t.numel() * itemsize(t.dtype)) fail("size != numel * itemsize");
      if (previous && !(previous->key < t.key)) fail("keys not sorted and unique");
      if (h.find(t.key) != &t) fail("find()");
      previous = &t;
    }
  } catch (const CheckpointError& e) {
    libreyolo::fuzz::expect_message(e.what(), "fuzz.safetensors");
  }
  return 0;
}
