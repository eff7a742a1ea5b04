// The seam between queue policy and model instances. Triton keeps its dynamic_batch_scheduler
// apart from backend_model_instance; here too a Scheduler owns the queue of one model and forms
// its batches, and each instance's worker (server/instance/model_instance.h) takes the next
// formed batch from it and runs it. Priorities, another queue policy or a sequence batcher are
// another Scheduler; the instances do not change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>

#include "server/api/types.h"
#include "server/scheduler/batch_job.h"

namespace libreyolo::server {

class Scheduler {
 public:
  /// What next_batch() produced.
  enum class Next {
    batch,    ///< a batch to run
    again,    ///< nothing to run this time (the oldest request went, every one expired, or
              ///< Refill::device_busy turned false with nothing queued)
    stopped,  ///< stopping and the queue is drained: the worker ends
  };

  virtual ~Scheduler() = default;

  /// Queues a request. Throws api::Error RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE
  /// when stopping or when no instance is left in rotation.
  virtual std::future<BatchResult> submit(std::shared_ptr<BatchJob> job) = 0;

  /// Takes `job` out of the queue when it still waits and answers it `code` (CANCELLED, or
  /// DEADLINE_EXCEEDED when its deadline passed): the slot is free at once. False when the job
  /// already runs or was answered.
  virtual bool cancel(const std::shared_ptr<BatchJob>& job, api::Code code) = 0;

  /// Requests waiting (not running).
  virtual int64_t pending() const = 0;

  /// What the calling instance answered right before asking for its next batch: closed-loop
  /// clients send their next requests as soon as they have their answers, so a scheduler may
  /// wait for them (DynamicBatcher's refill wait).
  struct Refill {
    int64_t answered_requests = 0;  ///< requests answered just before the call; 0: none
    Clock::duration compute{};      ///< the forward of those images (ModelInstance's infer time)
    /// Set by an instance whose previous batch still runs on its device (CUDA: launched, not
    /// finished): true until that forward ends. Until then the next batch keeps growing
    /// (to max_batch_size): formed earlier it would only wait behind that forward on the
    /// stream, with the requests answered meanwhile left for the batch after it. With nothing
    /// queued when it ends, next_batch() returns `again` (the instance answers that forward
    /// first). Called without the scheduler's lock held, every 50 us at most; must not block
    /// or throw.
    std::function<bool()> device_busy;
  };

  /// Called by an instance's worker: blocks until there is work or the scheduler stops, then
  /// forms one batch into `batch`. Requests whose deadline passed or whose call was cancelled
  /// while queued are answered here and never reach an instance. `refill` says what the
  /// instance has just answered ({} when nothing) and whether its device is still busy.
  virtual Next next_batch(Batch& batch, const Refill& refill) = 0;

  /// An instance left the rotation (its device failed). Returns the instances still in it; when
  /// none is left, every queued request is moved to `orphans` (the caller answers them once it
  /// reported the failure) and submit() refuses from then on.
  virtual std::size_t leave_rotation(Batch& orphans) = 0;

  /// Stops taking requests; next_batch() returns `stopped` once the queue is drained.
  virtual void stop() = 0;

  /// After the workers ended: answers UNAVAILABLE every request still queued (there are some
  /// only when every instance left the rotation).
  virtual void answer_left() = 0;
};

}  // namespace libreyolo::server
