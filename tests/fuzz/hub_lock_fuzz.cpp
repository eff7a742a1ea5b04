// libFuzzer target: kernels.lock (kernels/hub/lock.cpp parse_lock_text, what read_lock_file runs
// on the file's text), then what the hub provider does with an entry's variant names
// (kernels/hub/variant.cpp select_variants, for torch 2.11 CPU and CUDA 13.0 x86_64-linux).
// Every input either parses into entries whose names are safe to join to the cache folder, or
// throws LockError naming the file; select_variants never throws (it rejects); anything else is
// a bug. Seed corpus:
// tests/fuzz/corpus/hub_lock/ (config/kernels.lock, the hub tests' lock files).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/hub/lock.h"
#include "kernels/hub/variant.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::kernels::hub;
  using libreyolo::fuzz::fail;
  const std::string file = "/etc/libreyolo/kernels.lock";
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const LockEntry& e : parse_lock_text(text, file)) {
      if (!is_safe_relative_path(e.repo_id) || e.repo_id.find('/') == std::string::npos)
        fail("unsafe repo_id " + e.repo_id);
      std::vector<std::string> names;
      for (const auto& [name, variant] : e.variants) {
        names.push_back(name);
        if (!is_safe_relative_path(name) || name.find('/') != std::string::npos)
          fail("unsafe variant " + name);
        for (const auto& [path, digest] : variant.files)
          if (!is_safe_relative_path(path)) fail("unsafe file " + path);
      }
      SystemInfo cpu;
      cpu.torch_major = 2;
      cpu.torch_minor = 11;
      SystemInfo cuda = cpu;
      cuda.backend = "cuda";
      cuda.cuda_major = 13;
      cuda.compute_capability = std::make_pair(9, 0);
      for (const SystemInfo& system : {cpu, cuda}) {
        const Selection s = select_variants(names, system);
        if (s.accepted.size() + s.rejected.size() != names.size())
          fail("select_variants lost a name");
      }
    }
  } catch (const LockError& e) {
    libreyolo::fuzz::expect_message(e.what(), file);
  }
  return 0;
}
