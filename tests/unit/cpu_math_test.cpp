// models/runtime/cpu_math.h: the floating-point mode of a forward's threads. A denormal input
// (1e-39, below float32's 2^-126) survives a multiplication until flush_denormals_on_this_thread
// sets FTZ + DAZ on the calling thread and its OpenMP team; then every element of an operator
// large enough for ATen to split across that team comes out 0. A thread started before the call
// keeps IEEE arithmetic: MXCSR is per thread, and its team is its own.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "models/runtime/cpu_math.h"

namespace libreyolo::models {
namespace {

/// Non-zero elements of 1e-39 * 2 over 2^20 elements (ATen splits mul in chunks of 32,768).
int64_t nonzero_products() {
  const auto x = at::full({1 << 20}, 1e-39f, at::kFloat);
  return at::mul(x, 2).count_nonzero().item<int64_t>();
}

TEST(CpuMath, FlushDenormalsReachesTheTeamAndNoOtherThread) {
#if defined(__x86_64__) || defined(_M_X64)
  // A thread started first, which computes only after this one has flushed.
  std::mutex mu;
  std::condition_variable cv;
  bool flushed = false;
  int64_t other = -1;
  std::thread before([&] {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return flushed; });
    other = nonzero_products();
  });
  ASSERT_EQ(nonzero_products(), 1 << 20);  // IEEE: 2e-39, a denormal, in every element
  ASSERT_TRUE(flush_denormals_on_this_thread());
  EXPECT_EQ(nonzero_products(), 0);
  {
    std::lock_guard<std::mutex> lk(mu);
    flushed = true;
  }
  cv.notify_one();
  before.join();
  EXPECT_EQ(other, 1 << 20);
#else
  EXPECT_FALSE(flush_denormals_on_this_thread());
#endif
}

TEST(CpuMath, FlushDenormalsByDefaultForSixteenBitModelsOnly) {
  EXPECT_TRUE(flush_denormals_by_default(static_cast<int>(at::kBFloat16)));
  EXPECT_TRUE(flush_denormals_by_default(static_cast<int>(at::kHalf)));
  EXPECT_FALSE(flush_denormals_by_default(static_cast<int>(at::kFloat)));
  EXPECT_FALSE(flush_denormals_by_default(static_cast<int>(at::kDouble)));
}

}  // namespace
}  // namespace libreyolo::models
