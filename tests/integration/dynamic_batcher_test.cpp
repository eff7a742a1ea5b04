// The dynamic batcher's refill wait (server/scheduler/dynamic_batcher.h): an instance that has just
// answered k requests waits, at most refill_wait_fraction of their forward's time, until k
// requests have arrived (or the batch is full) before it runs a smaller batch. The batcher is
// driven directly here, as an instance's worker drives it; the clients are threads that submit
// after a delay. Bounds on elapsed time are behaviour (it went before its cap, or not before its
// end), never speed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/scheduler/dynamic_batcher.h"

namespace libreyolo::server {
namespace {

using namespace std::chrono_literals;

/// A request of `images` images of h x w pixels.
std::shared_ptr<BatchJob> job(int64_t images = 1, int64_t h = 8, int64_t w = 8) {
  auto j = std::make_shared<BatchJob>();
  j->pixels.push_back(at::zeros({images, 3, h, w}));
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
  void submit(int n, int64_t h = 8) {
    for (int i = 0; i < n; ++i) futures.push_back(batcher->submit(job(1, h, h)));
  }
  /// Submits `n` one-image requests of h x h pixels from another thread, `after` from now.
  std::thread submit_later(int n, std::chrono::milliseconds after, int64_t h = 8) {
    return std::thread([this, n, after, h] {
      std::this_thread::sleep_for(after);
      for (int i = 0; i < n; ++i) {
        auto f = batcher->submit(job(1, h, h));
        std::lock_guard<std::mutex> lk(mu);
        futures.push_back(std::move(f));
      }
    });
  }
  /// One next_batch call as an instance makes it: the batch it formed and how long it took.
  /// Fails the test unless it formed a batch.
  std::pair<Batch, Clock::duration> next(const Scheduler::Refill& refill) {
    Batch batch;
    const auto t0 = Clock::now();
    EXPECT_EQ(batcher->next_batch(batch, refill), Scheduler::Next::batch);
    return {std::move(batch), Clock::now() - t0};
  }
  std::unique_ptr<DynamicBatcher> batcher;
  std::mutex mu;
  std::vector<std::future<BatchResult>> futures;
};

Scheduler::Refill answered(int64_t requests, std::chrono::milliseconds compute) {
  Scheduler::Refill r;
  r.answered_requests = requests;
  r.compute = compute;
  return r;
}

TEST(DynamicBatcherRefill, WaitsForTheRequestsItAnsweredThenGoesAtOnce) {
  // The convoy of docs/BENCHMARKS.md: 4 closed-loop clients, max_batch_size 4, a batch of 3 just
  // answered while 1 request waited. Its 3 clients come back 50 ms later: one batch of 4, long
  // before the wait's cap (a 60 s forward at fraction 1).
  Fixture f(1.0);
  f.submit(1);
  auto later = f.submit_later(3, 50ms);
  const auto [batch, waited] = f.next(answered(3, 60000ms));
  later.join();
  EXPECT_EQ(batch.size(), 4u);
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 30s);
}

TEST(DynamicBatcherRefill, WaitsForAsManyArrivalsAsItAnswered) {
  // 1 answered, 2 queued when the instance came free: the batch goes once one request arrived
  // (it would wait the cap, 60 s, for a fourth image).
  Fixture f(1.0);
  f.submit(2);
  auto later = f.submit_later(1, 50ms);
  const auto [batch, waited] = f.next(answered(1, 60000ms));
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
  const auto [batch, waited] = f.next(answered(4, 400ms));
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_GE(waited, 200ms);
}

TEST(DynamicBatcherRefill, OneRequestAnsweredIsOneRequestAwaited) {
  // Concurrency 1: the client's next request runs as soon as it is there (batch-1 latency
  // unchanged by the wait), although the cap is 60 s.
  Fixture f(1.0);
  auto later = f.submit_later(1, 20ms);
  const auto [batch, waited] = f.next(answered(1, 60000ms));
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
    const auto [batch, waited] = f.next(refill);
    EXPECT_EQ(batch.size(), 1u) << "fraction " << fraction;
    EXPECT_LT(waited, 30s) << "fraction " << fraction;
  }
}

TEST(DynamicBatcherRefill, ArrivalsOfAnotherShapeEndTheWait) {
  // Two clients of 8x8 images were answered while two of 16x16 waited (a family that batches
  // one size only, as YOLOS): the 8x8 clients' return ends the wait, and the 16x16 pair runs
  // without waiting the cap for 16x16 images that will not come.
  Fixture f(1.0);
  f.submit(2, 16);
  auto later = f.submit_later(2, 50ms, 8);
  const auto [batch, waited] = f.next(answered(2, 60000ms));
  later.join();
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0]->extent(), (std::pair<int64_t, int64_t>{16, 16}));
  EXPECT_EQ(batch[1]->extent(), (std::pair<int64_t, int64_t>{16, 16}));
  EXPECT_LT(waited, 30s);
  EXPECT_EQ(f.batcher->pending(), 2);
}

TEST(DynamicBatcherRefill, AFewerImagesRequestIsNotHeldForTheImagesBefore) {
  // Concurrency 1, a 4-image request answered, then a 1-image one: it runs when it arrives.
  Fixture f(1.0);
  std::thread later([&] {
    std::this_thread::sleep_for(20ms);
    auto fut = f.batcher->submit(job(1));
    std::lock_guard<std::mutex> lk(f.mu);
    f.futures.push_back(std::move(fut));
  });
  const auto [batch, waited] = f.next(answered(1, 60000ms));
  later.join();
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0]->size(), 1);
  EXPECT_LT(waited, 30s);
}

TEST(DynamicBatcherRefill, NeverHoldsARequestPastItsQueueDeadline) {
  // The queued request's deadline is 10 s away, inside the 60 s cap: no wait, it runs (not
  // DEADLINE_EXCEEDED).
  Fixture f(1.0);
  auto j = job(1);
  j->deadline = Clock::now() + 10s;
  f.futures.push_back(f.batcher->submit(j));
  const auto [batch, waited] = f.next(answered(3, 60000ms));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], j);
  EXPECT_LT(waited, 5s);
}

TEST(DynamicBatcherRefill, PausesAfterTwoWaitsRanOutAndResumesWhenAProbeIsMet) {
  // Open-loop clients: 1 answered, 1 queued, nobody comes back. Two waits run to their end
  // (500 ms each), the next 8 chances do not wait, the 9th tries again (and runs out), then 8
  // more do not wait; the next try is met (a request comes back), and the one after waits again.
  Fixture f(0.25);
  const auto call = [&](std::thread* arrival) {
    f.submit(1);
    const auto waited = f.next(answered(1, 2000ms)).second;
    if (arrival) arrival->join();
    EXPECT_EQ(f.batcher->pending(), 0);
    return waited;
  };
  EXPECT_GE(call(nullptr), 500ms);
  EXPECT_GE(call(nullptr), 500ms);
  for (int i = 0; i < 8; ++i) EXPECT_LT(call(nullptr), 250ms) << "paused chance " << i;
  EXPECT_GE(call(nullptr), 500ms);  // the probe, run out
  for (int i = 0; i < 8; ++i) EXPECT_LT(call(nullptr), 250ms) << "paused again, chance " << i;
  auto back = f.submit_later(1, 50ms);
  const auto met = call(&back);  // the probe, met at once by the returning request
  EXPECT_GE(met, 50ms);
  EXPECT_LT(met, 500ms);
  EXPECT_GE(call(nullptr), 500ms);  // waiting again
}

TEST(DynamicBatcherRefill, StopEndsTheWait) {
  // Shutdown during a refill wait: the queued request still runs (drain), without the cap.
  Fixture f(1.0);
  f.submit(1);
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    f.batcher->stop();
  });
  const auto [batch, waited] = f.next(answered(4, 60000ms));
  stopper.join();
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_LT(waited, 30s);
  Batch none;
  EXPECT_EQ(f.batcher->next_batch(none, {}), Scheduler::Next::stopped);
}

// Refill::device_busy: a CUDA instance asks for its next batch while its previous forward
// still runs; the batch grows until that forward ends or it is full.

/// The ask of an instance whose forward in flight ends when `busy` turns false.
Scheduler::Refill in_flight(const std::atomic<bool>& busy) {
  Scheduler::Refill r;
  r.device_busy = [&busy] { return busy.load(); };
  return r;
}

/// Turns `busy` false `after` from now, on its own thread (which ends at once when the test
/// turned it false first).
std::thread end_forward(std::atomic<bool>& busy, std::chrono::milliseconds after) {
  return std::thread([&busy, after] {
    const auto end = Clock::now() + after;
    while (busy && Clock::now() < end) std::this_thread::sleep_for(1ms);
    busy = false;
  });
}

/// Stops `batcher` 10 s after construction unless destroyed first: a broken next_batch that
/// would wait for ever returns `stopped` instead, and the test fails rather than hangs.
class Watchdog {
 public:
  explicit Watchdog(DynamicBatcher& batcher)
      : thread_([this, &batcher] {
          std::unique_lock<std::mutex> lk(mu_);
          if (!cv_.wait_for(lk, 10s, [this] { return done_; })) batcher.stop();
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

TEST(DynamicBatcherDeviceBusy, GrowsUntilTheForwardInFlightEnds) {
  // max_queue_delay 0 (the default) would run the one queued request at once; behind a forward
  // it waits, and the two requests that come back 30 ms later join it: one batch of 3.
  Fixture f(0.0);
  Watchdog watchdog(*f.batcher);
  std::atomic<bool> busy{true};
  f.submit(1);
  const auto start = Clock::now();
  auto later = f.submit_later(2, 30ms);
  auto ends = end_forward(busy, 300ms);
  const auto batch = f.next(in_flight(busy)).first;
  const auto waited = Clock::now() - start;
  later.join();
  ends.join();
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_GE(waited, 300ms);
  EXPECT_EQ(f.batcher->pending(), 0);
}

TEST(DynamicBatcherDeviceBusy, AFullBatchGoesBehindTheForwardAtOnce) {
  // Full before the forward ends: it goes (queued on the stream behind it), the fifth request
  // waits for the next batch.
  Fixture f(0.0, 4);
  std::atomic<bool> busy{true};
  f.submit(5);
  auto ends = end_forward(busy, 10s);  // bounds a failure
  const auto [batch, waited] = f.next(in_flight(busy));
  busy = false;
  ends.join();
  EXPECT_EQ(batch.size(), 4u);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(f.batcher->pending(), 1);
}

TEST(DynamicBatcherDeviceBusy, NothingQueuedWhenTheForwardEndsIsAgain) {
  // The instance then answers its forward before it asks again.
  Fixture f(0.0);
  Watchdog watchdog(*f.batcher);
  std::atomic<bool> busy{true};
  const auto start = Clock::now();
  auto ends = end_forward(busy, 50ms);
  Batch batch;
  EXPECT_EQ(f.batcher->next_batch(batch, in_flight(busy)), Scheduler::Next::again);
  const auto waited = Clock::now() - start;
  ends.join();
  EXPECT_TRUE(batch.empty());
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 5s);
}

TEST(DynamicBatcherDeviceBusy, NeverHoldsARequestPastItsQueueDeadline) {
  // The queued request's deadline (300 ms) comes long before the forward's end (20 s): it goes
  // before its deadline, to run behind the forward, not answered DEADLINE_EXCEEDED.
  Fixture f(0.0);
  Watchdog watchdog(*f.batcher);
  std::atomic<bool> busy{true};
  auto j = job(1);
  j->deadline = Clock::now() + 300ms;
  f.futures.push_back(f.batcher->submit(j));
  auto ends = end_forward(busy, 20s);
  const auto [batch, waited] = f.next(in_flight(busy));
  busy = false;
  ends.join();
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], j);
  EXPECT_LT(waited, 5s);
}

TEST(DynamicBatcherDeviceBusy, AnIdleInstanceTakesWhatABusyOneGathers) {
  // Two instances: one waits behind its forward, the other is free and runs the queued request
  // at once; the busy one gets `again`.
  Fixture f(0.0);
  Watchdog watchdog(*f.batcher);
  std::atomic<bool> busy{true};
  f.submit(1);
  Scheduler::Next busy_next = Scheduler::Next::batch;
  Batch busy_batch;
  std::thread busy_instance(
      [&] { busy_next = f.batcher->next_batch(busy_batch, in_flight(busy)); });
  std::this_thread::sleep_for(50ms);
  const auto [batch, waited] = f.next({});
  busy = false;  // either way (gathering, or not there yet and finding nothing) it ends
  busy_instance.join();
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(busy_next, Scheduler::Next::again);
  EXPECT_TRUE(busy_batch.empty());
}

TEST(DynamicBatcherDeviceBusy, StopEndsTheWaitWithNothingQueued) {
  Fixture f(0.0);
  std::atomic<bool> busy{true};
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    f.batcher->stop();
  });
  Batch batch;
  EXPECT_EQ(f.batcher->next_batch(batch, in_flight(busy)), Scheduler::Next::stopped);
  stopper.join();
}

}  // namespace
}  // namespace libreyolo::server
