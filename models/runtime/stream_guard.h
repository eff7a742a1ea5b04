// A dedicated CUDA stream per model instance (Triton gives each instance its own), so that models
// sharing a GPU do not serialise on the legacy default stream.
#pragma once

#include <ATen/ATen.h>

#include <memory>

namespace libreyolo::models {

class StreamGuard {
 public:
  /// How the GPU's block scheduler ranks this stream's kernels against other streams' pending
  /// blocks (cudaStreamCreateWithPriority): `high` for short work on a request's critical path
  /// (image decode and preprocessing) that must not queue behind a whole forward's blocks.
  enum class Priority { normal, high };

  /// CUDA `device`: takes a stream of `priority` from PyTorch's stream pool for that device and
  /// makes it the calling thread's current stream until the guard dies. CPU: does nothing.
  /// Throws std::runtime_error for a CUDA device when this build's LibTorch has no CUDA.
  explicit StreamGuard(const at::Device& device, Priority priority = Priority::normal);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A point on the current CUDA stream of `device`: synchronize() blocks the host until the work
/// enqueued on that stream before record() has finished, and not the work enqueued after it
/// (what lets a batcher post-process one batch while the GPU runs the next). CPU: no-ops.
class StreamEvent {
 public:
  /// `timed`: created with timing (cudaEventDefault), so that seconds_since() can measure
  /// between two such events; untimed events (cudaEventDisableTiming) record more cheaply.
  explicit StreamEvent(const at::Device& device, bool timed = false);
  ~StreamEvent();
  StreamEvent(StreamEvent&&) noexcept;
  StreamEvent& operator=(StreamEvent&&) noexcept;

  /// Records the event on the calling thread's current stream.
  void record();
  /// Waits for it. Throws c10::Error on a CUDA error of that work.
  void synchronize();
  /// True when the recorded work has finished, or nothing was recorded, or on the CPU; never
  /// blocks. Throws c10::Error on a CUDA error of that work.
  bool query() const;
  /// Seconds of device time from `start` (recorded earlier on the same stream) to this event:
  /// cudaEventElapsedTime, resolution about 0.5 us. Both timed, recorded and finished. CPU:
  /// 0. Throws c10::Error otherwise (an untimed or unrecorded event, unfinished work).
  double seconds_since(const StreamEvent& start) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// True while the calling thread's current stream on the CUDA `device` is capturing a CUDA graph:
/// work enqueued now is recorded for replay, not run, so its results cannot be kept for eager
/// calls. CPU, or a build without CUDA: false.
bool stream_is_capturing(const at::Device& device);

}  // namespace libreyolo::models
