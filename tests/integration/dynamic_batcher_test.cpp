// The dynamic batcher's refill wait (server/scheduler/dynamic_batcher.h): an instance that has just
// answered k images waits, at most refill_wait_fraction of their forward's time, for k more
// images (plus those queued, up to max_batch_size) before it runs a smaller batch. The batcher is
// driven directly here, as an instance's worker drives it; the clients are threads that submit
// after a delay. Bounds on elapsed time are behaviour (it went before its cap, or not before its
// end), never speed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "server/scheduler/dynamic_batcher.h"

namespace libreyolo::server {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<BatchJob> one_image_job() {
  auto j = std::make_shared<BatchJob>();
  j->pixels.push_back(at::zeros({1, 3, 8, 8}));
  j->request = std::make_shared<TaskRequest>();
  return j;
}

struct Fixture {
  explicit Fixture(double fraction, int64_t max_batch = 4) {
    ServingConfig s;
    s.max_batch_size = max_batch;
    s.refill_wait_fraction = fraction;
    batcher = std::make_unique<DynamicBatcher>("m", s, 1, nullptr);
  }
  void submit(int n) {
    for (int i = 0; i < n; ++i) futures.push_back(batcher->submit(one_image_job()));
  }
  /// Submits `n` one-image requests from another thread, `after` from now, one by one.
  std::thread submit_later(int n, std::chrono::milliseconds after) {
    return std::thread([this, n, after] {
      std::this_thread::sleep_for(after);
      for (int i = 0; i < n; ++i) {
        auto j = one_image_job();
        auto f = batcher->submit(j);
        std::lock_guard<std::mutex> lk(mu);
        futures.push_back(std::move(f));
      }
    });
  }
  std::unique_ptr<DynamicBatcher> batcher;
  std::mutex mu;
  std::vector<std::future<BatchResult>> futures;
};

Scheduler::Refill answered(int64_t images, std::chrono::milliseconds compute) {
  Scheduler::Refill r;
  r.answered_images = images;
  r.compute = compute;
  return r;
}

TEST(DynamicBatcherRefill, WaitsForTheImagesItAnsweredThenGoesAtOnce) {
  // The convoy of docs/BENCHMARKS.md: 4 closed-loop clients, max_batch_size 4, a batch of 3 just
  // answered while 1 request waited. Its 3 clients come back 50 ms later: one batch of 4, long
  // before the wait's cap (a 60 s forward at fraction 1).
  Fixture f(1.0);
  f.submit(1);
  auto later = f.submit_later(3, 50ms);
  Batch batch;
  const auto t0 = Clock::now();
  EXPECT_EQ(f.batcher->next_batch(batch, answered(3, 60000ms)), Scheduler::Next::batch);
  const auto waited = Clock::now() - t0;
  later.join();
  EXPECT_EQ(batch.size(), 4u);
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 30s);
}

TEST(DynamicBatcherRefill, TargetIsTheAnsweredImagesPlusTheQueuedOnes) {
  // 1 answered, 2 queued when the instance came free: the batch goes once a third image is there
  // (it would wait the cap, 60 s, for a fourth).
  Fixture f(1.0);
  f.submit(2);
  auto later = f.submit_later(1, 50ms);
  Batch batch;
  const auto t0 = Clock::now();
  EXPECT_EQ(f.batcher->next_batch(batch, answered(1, 60000ms)), Scheduler::Next::batch);
  const auto waited = Clock::now() - t0;
  later.join();
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_LT(waited, 30s);
  EXPECT_EQ(f.batcher->pending(), 0);
}

TEST(DynamicBatcherRefill, EndsAtItsFractionOfTheForward) {
  // 4 answered, nobody comes back: the queued request runs alone once half of the 400 ms
  // forward has passed, not before.
  Fixture f(0.5);
  f.submit(1);
  Batch batch;
  const auto t0 = Clock::now();
  EXPECT_EQ(f.batcher->next_batch(batch, answered(4, 400ms)), Scheduler::Next::batch);
  const auto waited = Clock::now() - t0;
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_GE(waited, 200ms);
}

TEST(DynamicBatcherRefill, OneImageAnsweredIsOneImageAwaited) {
  // Concurrency 1: the client's next request runs as soon as it is there (batch-1 latency
  // unchanged by the wait), although the cap is 60 s.
  Fixture f(1.0);
  auto later = f.submit_later(1, 20ms);
  Batch batch;
  const auto t0 = Clock::now();
  EXPECT_EQ(f.batcher->next_batch(batch, answered(1, 60000ms)), Scheduler::Next::batch);
  const auto waited = Clock::now() - t0;
  later.join();
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_LT(waited, 30s);
}

TEST(DynamicBatcherRefill, FractionZeroAndNothingAnsweredRunWhatIsQueued) {
  // refill_wait_fraction 0 is Triton's batcher: the queued request runs at once. So does a call
  // after nothing was answered (the first batch, or again after `again`).
  for (const auto& [fraction, refill] :
       {std::pair{0.0, answered(3, 60000ms)}, std::pair{1.0, Scheduler::Refill{}}}) {
    Fixture f(fraction);
    f.submit(1);
    Batch batch;
    const auto t0 = Clock::now();
    EXPECT_EQ(f.batcher->next_batch(batch, refill), Scheduler::Next::batch);
    EXPECT_EQ(batch.size(), 1u) << "fraction " << fraction;
    EXPECT_LT(Clock::now() - t0, 30s) << "fraction " << fraction;
  }
}

TEST(DynamicBatcherRefill, StopEndsTheWait) {
  // Shutdown during a refill wait: the queued request still runs (drain), without the cap.
  Fixture f(1.0);
  f.submit(1);
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    f.batcher->stop();
  });
  Batch batch;
  const auto t0 = Clock::now();
  EXPECT_EQ(f.batcher->next_batch(batch, answered(4, 60000ms)), Scheduler::Next::batch);
  stopper.join();
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_LT(Clock::now() - t0, 30s);
  EXPECT_EQ(f.batcher->next_batch(batch, {}), Scheduler::Next::stopped);
}

}  // namespace
}  // namespace libreyolo::server
