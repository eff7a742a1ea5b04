// A kernel slot's implementation that throws the real c10::OutOfMemoryError (what the CUDA
// caching allocator throws) once: the call fails with kernels::OutOfMemory and the
// implementation stays enabled (tests/unit/registry/out_of_memory_test.cpp has the rules). CPU
// only: the error is thrown by hand.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>

#include "kernels/out_of_memory.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

constexpr SlotDef<int(int)> kOomSlot{"oom_test"};

TEST(KernelOutOfMemoryC10, AnOutOfMemoryErrorIsTransientOnce) {
  Registry r;
  r.declare(kOomSlot);
  r.register_impl(kOomSlot, kReference, std::function<Outcome<int>(int)>([](int x) { return x; }));
  int calls = 0;
  r.register_impl(kOomSlot, "cuda", std::function<Outcome<int>(int)>([&calls](int x) -> int {
                    if (++calls == 1) TORCH_CHECK_WITH(OutOfMemoryError, false, "no room (fake)");
                    return x + 1;
                  }));
  const auto handle = r.bind(kOomSlot, BindContext{});
  try {
    handle(1);
    FAIL() << "c10::OutOfMemoryError fell back instead of failing the call";
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(e.what(), "kernel oom_test/cuda ran out of memory: no room (fake)");
  }
  EXPECT_EQ(r.active().at("oom_test"), "cuda");
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(handle(1), 2);  // the same implementation serves the retry
  EXPECT_EQ(out_of_memory_count(r, "oom_test", "cuda"), 1u);
}

}  // namespace
}  // namespace libreyolo::kernels
