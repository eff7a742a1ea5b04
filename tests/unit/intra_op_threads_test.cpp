// models::use_intra_op_threads: a per-thread limit on ATen's OpenMP team, and the preprocessing
// pool that applies it on each worker (server/core/thread_pool.h, server/core/core.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "models/runtime/intra_op_threads.h"
#include "server/core/thread_pool.h"

using libreyolo::models::use_intra_op_threads;
using libreyolo::server::ThreadPool;

TEST(IntraOpThreads, LimitsTheCallingThreadAndNoOther) {
  const int process = at::get_num_threads();
  ASSERT_GE(process, 1);
  // Set explicitly, as the daemon does (ServerCore): each new thread's lazy initialisation then
  // sets MKL's per-thread count to it too (at::init_num_threads), which the limit must undo.
  at::set_num_threads(process);
  bool held = false;
  int inside = -1, mkl_inside = -1, process_seen = -1;
  // MKL's count for the thread (LibTorch's static MKL exports MKL_Get_Max_Threads, the C entry
  // of mkl_get_max_threads; absent in a build without MKL, where the check is skipped).
  using MklGet = int (*)();
  const auto mkl_get = reinterpret_cast<MklGet>(dlsym(RTLD_DEFAULT, "MKL_Get_Max_Threads"));
  std::thread limited([&] {
    held = use_intra_op_threads(1);
    inside = at::get_num_threads();
    if (mkl_get != nullptr) mkl_inside = mkl_get();
    process_seen = libreyolo::models::process_intra_op_threads();
    // An operator large enough for at::parallel_for still gives the exact answer serially.
    const auto x = at::arange(1 << 20, at::kDouble);
    EXPECT_EQ(x.sum().item<double>(), 549755289600.0);  // n (n - 1) / 2, n = 2^20
  });
  limited.join();
  EXPECT_TRUE(held);
  EXPECT_EQ(inside, 1);
  if (mkl_get != nullptr) EXPECT_EQ(mkl_inside, 1);  // MKL's GEMMs fork no team either
  EXPECT_EQ(process_seen, process);  // the process's count, asked from the limited thread
  EXPECT_EQ(at::get_num_threads(), process);
  int fresh = -1;
  std::thread other([&] { fresh = at::get_num_threads(); });
  other.join();
  EXPECT_EQ(fresh, process);  // a thread that did not ask keeps the process default
}

TEST(IntraOpThreads, RefusesLessThanOneThread) {
  EXPECT_FALSE(use_intra_op_threads(0));
  EXPECT_FALSE(use_intra_op_threads(-3));
}

TEST(ThreadPoolOnStart, RunsOnEveryWorkerBeforeItsFirstTask) {
  std::atomic<int> started{0};
  std::vector<int> threads_seen;
  {
    ThreadPool pool(3, [&](int threads) {
      EXPECT_EQ(threads, 3);
      use_intra_op_threads(1);
      started += 1;
    });
    EXPECT_EQ(pool.size(), 3);
    std::vector<std::future<int>> f;
    for (int i = 0; i < 6; ++i) f.push_back(pool.submit([] { return at::get_num_threads(); }));
    for (auto& x : f) threads_seen.push_back(x.get());
  }
  EXPECT_EQ(started.load(), 3);
  EXPECT_EQ(threads_seen, std::vector<int>(6, 1));
}

TEST(ThreadPoolOnStart, AThrowingStartLeavesTheWorkerServing) {
  ThreadPool pool(1, [](int) { throw std::runtime_error("no"); });
  EXPECT_EQ(pool.submit([] { return 7; }).get(), 7);
}
