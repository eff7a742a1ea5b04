// A kernel's once-per-dtype check against ATen before it serves (the conv2d_bias_act epilogue,
// cuda_depthwise): run on the device of the first call, its verdict kept for the process. A
// kernel that fails it stays declined (its decline reason says so) instead of serving wrong
// numbers. Host code; no CUDA compiler needed.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <atomic>
#include <functional>
#include <mutex>

namespace libreyolo::kernels::cuda {

enum class Verified { unknown, yes, no };

class VerifiedOnce {
 public:
  /// The verdict for `dtype` (float32, float16 or bfloat16; any other counts as bfloat16): the
  /// kept one, else check()'s (true: the kernel agrees with ATen), kept for the process.
  /// `unknown` inside a CUDA graph capture, where check(), which synchronises, is not run: the
  /// daemon's capture follows an eager warm-up, which runs it. Thread-safe; check() runs under
  /// the lock, on the caller's device (its context exists), at most once per verdict.
  Verified get(c10::ScalarType dtype, const std::function<bool()>& check) {
    // Read on every call: an atomic per dtype, the mutex only for the one check.
    std::atomic<int>& v = state_[dtype == c10::kFloat ? 0 : dtype == c10::kHalf ? 1 : 2];
    if (const auto known = static_cast<Verified>(v.load(std::memory_order_acquire));
        known != Verified::unknown)
      return known;
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto known = static_cast<Verified>(v.load()); known != Verified::unknown)
      return known;
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
      return Verified::unknown;
    const Verified result = check() ? Verified::yes : Verified::no;
    v.store(static_cast<int>(result), std::memory_order_release);
    return result;
  }

 private:
  std::atomic<int> state_[3] = {};
  std::mutex mutex_;
};

}  // namespace libreyolo::kernels::cuda
