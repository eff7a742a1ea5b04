// libFuzzer target: a hub variant's build/<variant>/metadata.json (kernels/hub/metadata.cpp
// parse_metadata, what read_metadata runs on the file's text, then the name checks of
// verify_metadata_digest against an empty folder listing). Every input either parses into an `id`
// that is a C identifier or throws std::runtime_error naming the file; anything else is a bug.
// Seed corpus: tests/fuzz/corpus/hub_metadata/ (tests/hub's metadata.json files, upstream's).
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/hub/metadata.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::kernels::hub;
  using libreyolo::fuzz::fail;
  const std::string file = "/cache/build/torch211-cxx11-cpu-x86_64-linux/metadata.json";
  const std::string text(reinterpret_cast<const char*>(data), size);
  KernelMetadata m;
  try {
    m = parse_metadata(text, file);
  } catch (const std::runtime_error& e) {
    libreyolo::fuzz::expect_message(e.what(), file);
    return 0;
  }
  if (m.id.empty() || !(std::isalpha(static_cast<unsigned char>(m.id[0])) || m.id[0] == '_'))
    fail("id " + m.id);
  for (char ch : m.id)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) fail("id " + m.id);
  try {
    // No file on disk: only listed names are checked (a listed file is "missing").
    verify_metadata_digest(m, "/nonexistent", {});
    if (m.has_digest && !m.digest_files.empty()) fail("a listed file passed without existing");
  } catch (const std::runtime_error&) {
  }
  return 0;
}
