// libFuzzer target: kernels.lock in both formats (kernels/hub/lock.cpp parse_lock_text, what
// read_lock_file runs on the file's text: this daemon's per-file digests and huggingface/kernels'
// git_lfs_concat hashes), then what the hub provider does with an entry's variant names
// (kernels/hub/variant.cpp select_variants, for torch 2.11 CPU and CUDA 13.0 x86_64-linux), the
// lock written back in both formats and read again, and the same bytes as a LOCAL_KERNELS value
// (parse_local_kernels).
// Every input either parses into entries whose names are safe to join to the cache folder, or
// throws LockError naming the file; an upstream hash is "sha256-<64 hex>"; select_variants never
// throws (it rejects); LOCAL_KERNELS either parses into <org>/<name> = non-empty path or throws
// LocalKernelsError; anything else is a bug. Seed corpus:
// tests/fuzz/corpus/hub_lock/ (config/kernels.lock, the hub tests' lock files, upstream.lock).
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
    for (const auto& [repo_id, path] : parse_local_kernels(text)) {
      if (repo_id.find('/') == std::string::npos || !is_safe_relative_path(repo_id))
        fail("LOCAL_KERNELS: unsafe repo_id " + repo_id);
      if (path.empty()) fail("LOCAL_KERNELS: empty path");
    }
  } catch (const LocalKernelsError& e) {
    libreyolo::fuzz::expect_message(e.what(), "Invalid LOCAL_KERNELS entry: ");
  }
  try {
    const std::vector<LockEntry> entries = parse_lock_text(text, file);
    // Written back in this daemon's format and read again: the same pins.
    std::vector<LockEntry> again;
    try {
      again = parse_lock_text(lock_text(entries), file);
    } catch (const LockError& e) {
      fail(std::string("the written lock does not parse: ") + e.what());
    }
    if (again.size() != entries.size()) fail("libreyolo round trip lost an entry");
    for (size_t i = 0; i < entries.size(); ++i) {
      if (again[i].sha != entries[i].sha || again[i].variants.size() != entries[i].variants.size())
        fail("libreyolo round trip changed entry " + std::to_string(i));
    }
    for (const LockEntry& e : entries) {
      if (!is_safe_relative_path(e.repo_id) || e.repo_id.find('/') == std::string::npos)
        fail("unsafe repo_id " + e.repo_id);
      std::vector<std::string> names;
      for (const auto& [name, variant] : e.variants) {
        names.push_back(name);
        if (!is_safe_relative_path(name) || name.find('/') != std::string::npos)
          fail("unsafe variant " + name);
        for (const auto& [path, digest] : variant.files)
          if (!is_safe_relative_path(path)) fail("unsafe file " + path);
        if (!variant.hash.empty() &&
            (variant.hash.size() != 71 || variant.hash.rfind("sha256-", 0) != 0))
          fail("bad upstream hash " + variant.hash);
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
