// An out-of-memory of an implementation is transient the first time in a row: the call throws
// kernels::OutOfMemory (the server answers RESOURCE_EXHAUSTED), the implementation stays
// enabled, nothing falls back; a second one in a row disables it like any runtime failure. No
// torch here: the allocator's message is what is recognised (tests/unit/kernel_oom_test.cpp
// throws the real c10::OutOfMemoryError).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/out_of_memory.h"
#include "kernels/registry.h"
#include "log/log.h"

namespace libreyolo::kernels {
namespace {

constexpr SlotDef<int(int)> kOp{"op"};
using Impl = std::function<Outcome<int>(int)>;

/// `cuda` fails with the caching allocator's message on the calls whose input is negative.
void add_impls(Registry& r, int& cuda_calls) {
  r.declare(kOp);
  r.register_impl(kOp, kReference, Impl([](int x) -> Outcome<int> { return x; }));
  r.register_impl(kOp, "cuda", Impl([&cuda_calls](int x) -> Outcome<int> {
                    ++cuda_calls;
                    if (x < 0) {
                      throw std::runtime_error(
                          "CUDA out of memory. Tried to allocate 2.00 GiB\nException raised "
                          "from malloc at CUDACachingAllocator.cpp:1 (most recent call first):");
                    }
                    return x + 100;
                  }));
}

std::uint64_t ooms(const Registry& r) { return out_of_memory_count(r, "op", "cuda"); }

TEST(KernelOutOfMemory, TheFirstInARowFailsTheCallAndKeepsTheImplementation) {
  log::Capture capture;
  Registry r;
  int cuda_calls = 0;
  add_impls(r, cuda_calls);
  const auto handle = r.bind(kOp, BindContext{});
  try {
    handle(-1);
    FAIL() << "the out-of-memory fell back instead of failing the call";
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(
        e.what(),
        "kernel op/cuda ran out of memory: CUDA out of memory. Tried to allocate 2.00 GiB");
    EXPECT_EQ(e.slot(), "op");
    EXPECT_EQ(e.impl(), "cuda");
  }
  EXPECT_EQ(cuda_calls, 1);
  EXPECT_EQ(r.active().at("op"), "cuda");
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(ooms(r), 1u);
  EXPECT_EQ(capture.count(log::Level::warn, "kernel op/cuda ran out of memory"), 1);
  // A success between two out-of-memory failures ends the streak: the next one is transient.
  EXPECT_EQ(handle(1), 101);
  EXPECT_THROW(handle(-1), OutOfMemory);
  EXPECT_EQ(handle(2), 102);
  EXPECT_EQ(r.active().at("op"), "cuda");
  EXPECT_EQ(ooms(r), 2u);
  EXPECT_EQ(r.report()[0].candidates[0].calls, 2u);
}

TEST(KernelOutOfMemory, TheSecondInARowDisablesTheImplementation) {
  Registry r;
  int cuda_calls = 0;
  add_impls(r, cuda_calls);
  const auto handle = r.bind(kOp, BindContext{});
  EXPECT_THROW(handle(-1), OutOfMemory);
  EXPECT_EQ(handle(-2), -2);  // disabled, the reference answers
  EXPECT_EQ(handle(3), 3);
  EXPECT_EQ(cuda_calls, 2);
  EXPECT_EQ(r.active().at("op"), kReference);
  const auto ev = r.events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].impl, "cuda");
  EXPECT_EQ(ev[0].reason,
            "CUDA out of memory. Tried to allocate 2.00 GiB\nException raised from malloc at "
            "CUDACachingAllocator.cpp:1 (most recent call first):");
  EXPECT_EQ(ooms(r), 2u);
  EXPECT_TRUE(r.report()[0].candidates[0].disabled);
}

TEST(KernelOutOfMemory, OtherFailuresStillDisableAtOnce) {
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("CUDA error: an illegal memory access")));
  EXPECT_TRUE(is_out_of_memory(std::runtime_error("CUDA error: out of memory")));
  Registry r;
  r.declare(kOp);
  r.register_impl(kOp, kReference, Impl([](int x) -> Outcome<int> { return x; }));
  r.register_impl(kOp, "cuda", Impl([](int) -> Outcome<int> {
                    throw std::runtime_error("CUDA error: an illegal memory access");
                  }));
  EXPECT_EQ(r.bind(kOp, BindContext{})(7), 7);
  EXPECT_EQ(r.active().at("op"), kReference);
  EXPECT_EQ(ooms(r), 0u);
}

}  // namespace
}  // namespace libreyolo::kernels
