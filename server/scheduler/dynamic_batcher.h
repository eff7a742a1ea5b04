// Triton's dynamic batcher as a Scheduler: requests of one model queue in arrival order; a batch
// starts from the oldest request and takes the queued requests of the same pixel size (any size
// for padded families whose model reads pixel_mask, which are padded to the largest with it) up to
// max_batch_size images, waiting at most max_queue_delay_microseconds for the oldest; requests
// whose deadline passed or whose call was cancelled while queued are answered without running.
// Beyond Triton: the refill wait. An instance that has just answered k requests waits, at most
// refill_wait_fraction of their forward's time, until k requests have arrived (or the batch is
// full) before running a smaller batch: closed-loop clients answered by a batch send their next
// requests within a few milliseconds, and without the wait the batches settle into alternating
// halves whatever max_queue_delay_microseconds is, since the requests queued during a forward
// have waited longer than any window by the time the instance is free (docs/BENCHMARKS.md,
// "The refill wait"). Batch-1 latency is unchanged: after one request, one request is enough.
// It never holds a request past its queue deadline, and a CUDA instance with a batch still in
// flight does not ask for it (server/instance/model_instance.cpp): that instance asks for
// Refill::device_busy instead, and the next batch grows until the forward in flight ends or it
// is full. Formed at once, it would wait behind that forward anyway with only the requests
// queued so far; at 64 closed-loop clients and max_batch_size 32 the batches then averaged about
// 19 images and the GPU ran padded forwards (docs/BENCHMARKS.md, "Served JPEG at the defaults").
// Open-loop clients, whose arrivals do not follow the answers, make the refill waits run to
// their end: after two such waits in a row it pauses, trying again once in every nine chances
// (a wait that is met resumes it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "server/config/serving_config.h"
#include "server/scheduler/scheduler.h"

namespace libreyolo::server {

class DynamicBatcher final : public Scheduler {
 public:
  /// `model` names the model in every message; `serving` gives max_batch_size,
  /// max_queue_delay_microseconds, refill_wait_fraction and max_queue_size; `instances` is how many
  /// instances start in rotation. `pending` is called with the queue length after each change
  /// (under the queue's lock, so that updates never overtake each other); it may be empty.
  DynamicBatcher(std::string model, const ServingConfig& serving, std::size_t instances,
                 std::function<void(int64_t)> pending);

  std::future<BatchResult> submit(std::shared_ptr<BatchJob> job) override;
  bool cancel(const std::shared_ptr<BatchJob>& job, api::Code code) override;
  int64_t pending() const override;
  Next next_batch(Batch& batch, const Refill& refill) override;
  std::size_t leave_rotation(Batch& orphans) override;
  void stop() override;
  void answer_left() override;

 private:
  const std::string name_;
  const int64_t max_batch_;
  const std::chrono::microseconds delay_;
  const double refill_fraction_;  ///< serving.refill_wait_fraction, 0 to 1
  const std::size_t max_queue_;
  std::function<void(int64_t)> pending_hook_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<BatchJob>> queue_;
  std::uint64_t submitted_ = 0;  ///< requests queued since construction (the refill wait's count)
  /// Whether this chance may wait (under mu_): always, unless kRefillMissesToPause waits in a
  /// row ran to their end (open-loop clients); then once in kRefillPause + 1 chances, so that
  /// such clients' queued requests lose little latency.
  bool refill_allowed();

  /// Refill waits that ran to their end in a row, and the chances skipped since they paused.
  int refill_misses_ = 0, refill_skipped_ = 0;
  static constexpr int kRefillMissesToPause = 2, kRefillPause = 8;
  /// How often Refill::device_busy is asked while the batch grows behind a forward in flight.
  static constexpr std::chrono::microseconds kBusyPoll{50};
  /// A batch growing behind a forward in flight goes this long before a queued request's
  /// deadline at the latest.
  static constexpr std::chrono::microseconds kBusyDeadlineMargin{1000};
  bool stopping_ = false;
  std::size_t in_rotation_;  ///< instances that still take batches
};

}  // namespace libreyolo::server
