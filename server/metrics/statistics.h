// Small helpers of the statistics (Triton's StatisticDuration) and timings. No torch.
#pragma once

#include <chrono>
#include <cstdint>

#include "server/api/types.h"

namespace libreyolo::server {

using Clock = std::chrono::steady_clock;

/// Seconds from `t` to now (steady clock).
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Adds one sample of `seconds` to a cumulative count and nanoseconds.
inline void add_duration(api::Duration& d, double seconds) {
  d.count += 1;
  d.ns += static_cast<std::uint64_t>(seconds * 1e9);
}

/// Milliseconds since the Unix epoch (ModelStatistics.last_inference).
inline std::uint64_t now_ms() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace libreyolo::server
