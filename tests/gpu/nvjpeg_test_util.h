// What the `image_decode` / `image_decode_batch` GPU tests (tests/gpu/image_decode_*_test.cpp)
// share: a registry with the slot's reference and the nvjpeg provider, both slots bound for
// cuda:0 as the server binds them (server/instance/loaded_model.cpp), the fixtures' bytes, and
// the bound nvjpeg candidates' counters.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"

namespace libreyolo::kernels::nvjpeg_test {

/// The bytes of tests/fixtures/images/<relative>.
inline std::vector<uint8_t> read_image_fixture(const std::string& relative) {
  return libreyolo::image::read_file_bytes(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/" +
                                           relative);
}

/// A registry with the slot's reference and the nvjpeg provider, resolved; both handles bound
/// for cuda:0 under the model name "m". Empty `why` when nvjpeg is a candidate.
struct NvjpegSetup {
  Registry reg;
  ImageDecodeHandle handle;
  ImageDecodeBatchHandle batch;
  std::string why;
  NvjpegSetup() {
    if (!at::cuda::is_available()) {
      why = "no CUDA device";
      return;
    }
    auto provider = make_nvjpeg_provider();
    if (!provider) {
      why = "built without CUDA";
      return;
    }
    register_builtin_slots(reg);
    libreyolo::image::register_image_decode_reference(reg);
    reg.add_provider(provider);
    reg.resolve();
    for (const auto& p : reg.providers())
      if (p.name == "nvjpeg" && p.state != "loaded") why = "nvjpeg " + p.state + ": " + p.detail;
    if (!why.empty()) return;
    BindContext ctx;
    ctx.device = BindContext::Device::cuda;
    ctx.device_index = 0;
    ctx.model = "m";
    handle = reg.bind(kImageDecode, ctx);
    batch = reg.bind(kImageDecodeBatch, ctx);
  }
  /// The nvjpeg candidate of the binding of `slot`: its calls and declines per reason (empty
  /// when unbound).
  std::optional<CandidateReport> nvjpeg(const std::string& slot = "image_decode") const {
    for (const auto& b : reg.bindings())
      if (b.model == "m" && b.slot == slot)
        for (const auto& c : b.candidates)
          if (c.name == "nvjpeg") return c;
    return std::nullopt;
  }
};

/// Runs `round` twice (nvJPEG's buffers grow to the largest input once), then `rounds` times,
/// and expects no growth: the caching allocator's allocated bytes on cuda:0 unchanged (every
/// output tensor released; allocated_bytes[0] is the AGGREGATE statistic, every pool) and the
/// device's free memory (cudaMemGetInfo: nvJPEG's own cudaMalloc'd buffers) within 2 MiB (the
/// driver's own bookkeeping). `round` synchronises its work. Prints both, prefixed by `label`.
inline void expect_no_device_memory_growth(const std::function<void()>& round, int rounds,
                                           const char* label) {
  round();
  round();
  const auto torch_before =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int i = 0; i < rounds; ++i) round();
  const auto torch_after =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  std::printf("%s: torch allocated %lld -> %lld bytes, device free %zu -> %zu bytes\n", label,
              static_cast<long long>(torch_before), static_cast<long long>(torch_after),
              free_before, free_after);
  EXPECT_EQ(torch_after, torch_before);
  EXPECT_LE(free_before, free_after + (size_t{2} << 20));
}

#define REQUIRE_NVJPEG(s) \
  if (!(s).why.empty()) GTEST_SKIP() << (s).why

}  // namespace libreyolo::kernels::nvjpeg_test
