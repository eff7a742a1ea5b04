#include "server/scheduler/dynamic_batcher.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace libreyolo::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// Requests that can share a forward: any sizes when both may (BatchJob::any_size: the
/// processor pads and the model reads pixel_mask, as Deformable DETR: padded to the batch's
/// largest size, as transformers' processor pads a batch), else the same extent (a family
/// without a pixel mask, YOLOS, encodes padding like pixels: a larger batch would change its
/// detections).
bool same_shape(const BatchJob& a, const BatchJob& b) {
  if (a.padded != b.padded) return false;
  if (a.any_size && b.any_size) return true;
  return a.extent() == b.extent();
}

}  // namespace

DynamicBatcher::DynamicBatcher(std::string model, const ServingConfig& serving,
                               std::size_t instances, std::function<void(int64_t)> pending)
    : name_(std::move(model)),
      max_batch_(serving.max_batch_size),
      delay_(serving.max_queue_delay_microseconds),
      refill_fraction_(serving.refill_wait_fraction),
      max_queue_(serving.max_queue_size),
      pending_hook_(std::move(pending)),
      in_rotation_(instances) {}

int64_t DynamicBatcher::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}

std::future<BatchResult> DynamicBatcher::submit(std::shared_ptr<BatchJob> job) {
  auto future = job->promise.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      throw api::Error(api::Code::unavailable, "model '" + name_ + "' is shutting down");
    }
    if (in_rotation_ == 0) {
      throw api::Error(api::Code::unavailable,
                       "model '" + name_ + "': no instance left in rotation (every device failed)");
    }
    if (queue_.size() >= max_queue_) {
      throw api::Error(api::Code::resource_exhausted,
                       c10::str("model '", name_, "': queue full (max_queue_size ", max_queue_,
                                " requests waiting)"));
    }
    job->enqueued = Clock::now();
    queue_.push_back(std::move(job));
    ++submitted_;
    const auto n = static_cast<int64_t>(queue_.size());
    // Under the lock: updates from submit() and the workers must not overtake each other.
    if (pending_hook_) pending_hook_(n);
  }
  cv_.notify_all();
  return future;
}

bool DynamicBatcher::cancel(const std::shared_ptr<BatchJob>& job, api::Code code) {
  Clock::time_point enqueued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    enqueued = job->enqueued;
    queue_.erase(it);
    if (pending_hook_) pending_hook_(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_all();
  const auto waited_ms = static_cast<int64_t>(seconds(Clock::now() - enqueued) * 1000);
  job->promise.set_exception(std::make_exception_ptr(api::Error(
      code,
      code == api::Code::deadline_exceeded
          ? c10::str("model '", name_, "': deadline exceeded after ", waited_ms, " ms in the queue")
          : c10::str("model '", name_, "': cancelled by the client after ", waited_ms,
                     " ms in the queue"))));
  return true;
}

bool DynamicBatcher::refill_allowed() {
  if (refill_misses_ < kRefillMissesToPause) return true;
  const bool probe = refill_skipped_ >= kRefillPause;
  refill_skipped_ = probe ? 0 : refill_skipped_ + 1;
  return probe;
}

Scheduler::Next DynamicBatcher::next_batch(Batch& out, const Refill& refill) {
  out.clear();
  Batch batch;
  // The refill wait (dynamic_batcher.h): from the moment the instance is free, at most
  // refill_wait_fraction of the answered batch's forward (clamped: a caller's absurd duration
  // must not overflow the clock).
  const auto freed = Clock::now();
  const auto compute = std::min<Clock::duration>(refill.compute, std::chrono::hours(1));
  const auto refill_end =
      freed + std::chrono::duration_cast<Clock::duration>(compute * refill_fraction_);
  {
    std::unique_lock<std::mutex> lk(mu_);
    const bool refilling = refill_fraction_ > 0 && refill.answered_requests > 0 && refill_allowed();
    const std::uint64_t submitted_when_freed = submitted_;
    const auto arrived = [&] {
      return submitted_ - submitted_when_freed >=
             static_cast<std::uint64_t>(refill.answered_requests);
    };
    // Refill::device_busy asks the driver: outside the queue's lock, which submit(), cancel()
    // and the other instances need meanwhile.
    const auto query_device = [&] {
      lk.unlock();
      const bool busy = refill.device_busy();
      lk.lock();
      return busy;
    };
    if (refill.device_busy) {
      // Nothing queued and a forward in flight: wait for a request only until it ends, so that
      // the instance answers it first (then it asks again).
      while (!stopping_ && queue_.empty()) {
        const bool busy = query_device();
        if (stopping_ || !queue_.empty()) break;  // while the lock was released
        if (!busy) return Next::again;
        cv_.wait_for(lk, kBusyPoll);
      }
    } else {
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    }
    if (queue_.empty()) return Next::stopped;  // stopping and drained
    const auto first = queue_.front();
    const auto window_end = first->enqueued + delay_;
    // Let the batch grow until it is full, the oldest request has waited `delay_` and the
    // refill wait is over: as many requests arrived as were answered (counted whatever their
    // shape or size, so that neither a client switching image sizes nor one sending fewer
    // images than before waits for what will not come), or its end passed.
    bool waited_for_refill = false, full = false, timed_out = false;
    while (!stopping_) {
      int64_t images = 0;
      auto earliest_deadline = Clock::time_point::max();
      for (const auto& j : queue_) {
        if (!same_shape(*j, *first)) continue;
        images += j->size();
        if (j->deadline) earliest_deadline = std::min(earliest_deadline, *j->deadline);
      }
      if (images >= max_batch_) {
        full = true;
        break;
      }
      // Never wait a queued request past its queue deadline (default_timeout_microseconds):
      // when one would expire within the wait, the batch goes now.
      const bool awaiting = refilling && !arrived() && earliest_deadline > refill_end;
      auto until = awaiting ? std::max(window_end, refill_end) : window_end;
      // The instance's previous forward still runs: keep gathering until it ends, polled (the
      // device calls nothing back), but not to within kBusyDeadlineMargin of a queued
      // request's deadline: held to it (a wait overshoots), the request would be answered
      // DEADLINE_EXCEEDED where it used to run behind that forward.
      const auto now = Clock::now();
      if (refill.device_busy && earliest_deadline > now + kBusyDeadlineMargin) {
        const bool busy = query_device();
        // cancel() or another instance may have taken `first` while the lock was released.
        if (queue_.empty() || queue_.front() != first) break;
        if (busy) until = std::max(until, now + kBusyPoll);
      }
      if (now >= until) {
        timed_out = awaiting;
        break;
      }
      waited_for_refill = waited_for_refill || (awaiting && refill_end > window_end);
      cv_.wait_until(lk, until);
      // cancel() or another instance may have taken `first` out while the lock was released
      // (front() of an empty queue below was undefined behaviour: a stale job answered twice,
      // "Promise already satisfied", terminate).
      if (queue_.empty() || queue_.front() != first) break;
    }
    if (waited_for_refill && (full || arrived())) {
      refill_misses_ = 0;
    } else if (waited_for_refill && timed_out) {
      refill_misses_ = std::min(refill_misses_ + 1, kRefillMissesToPause);
    }
    if (queue_.empty() || queue_.front() != first) return Next::again;  // from the new oldest
    int64_t images = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (same_shape(**it, *first) && images + (*it)->size() <= max_batch_) {
        images += (*it)->size();
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (batch.empty()) {  // a first request larger than max_batch_size (validated earlier)
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    const auto left = static_cast<int64_t>(queue_.size());
    if (pending_hook_) pending_hook_(left);
  }
  // The other instances may take what this batch left behind.
  cv_.notify_all();
  // Requests whose deadline passed while queued are answered without running.
  const auto now = Clock::now();
  for (auto& j : batch) {
    if (j->deadline && now >= *j->deadline) {
      j->promise.set_exception(std::make_exception_ptr(api::Error(
          api::Code::deadline_exceeded,
          c10::str("model '", name_, "': deadline exceeded after ",
                   static_cast<int64_t>(seconds(now - j->enqueued) * 1000), " ms in the queue"))));
    } else if (j->cancelled && j->cancelled()) {
      j->promise.set_exception(std::make_exception_ptr(
          api::Error(api::Code::cancelled, "model '" + name_ + "': cancelled by the client")));
    } else {
      out.push_back(std::move(j));
    }
  }
  return out.empty() ? Next::again : Next::batch;
}

std::size_t DynamicBatcher::leave_rotation(Batch& orphans) {
  std::lock_guard<std::mutex> lk(mu_);
  if (in_rotation_ > 0) --in_rotation_;
  if (in_rotation_ == 0 && !queue_.empty()) {
    orphans.insert(orphans.end(), std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.end()));
    queue_.clear();
    if (pending_hook_) pending_hook_(0);
  }
  return in_rotation_;
}

void DynamicBatcher::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

void DynamicBatcher::answer_left() {
  std::deque<std::shared_ptr<BatchJob>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(queue_);
  }
  for (auto& j : left) {
    try {
      j->promise.set_exception(std::make_exception_ptr(
          api::Error(api::Code::unavailable, "model '" + name_ + "' is shutting down")));
    } catch (const std::future_error&) {
    }
  }
}

}  // namespace libreyolo::server
