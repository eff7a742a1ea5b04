// A log line a client can provoke at will, at most once per interval (grpc_server.cpp: a
// malformed request per call). No gRPC, no torch.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "log/log.h"

namespace libreyolo::server::rpc {

/// Writes at most one line per `interval`: the first call writes, later calls within the
/// interval are only counted, and the next line written ends with how many were left out
/// (" (N more since the last line)"). Without it a peer sending garbage in a loop writes one line
/// per call: the log grows at the peer's request rate. Thread-safe.
class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(log::Level level, Clock::duration interval = std::chrono::seconds(1))
      : level_(level), interval_(interval) {}

  /// Writes `message` at the limiter's level when the last line written is at least `interval`
  /// older than `now` (or none was), else counts it. Returns whether it was written.
  bool write(std::string_view message, Clock::time_point now = Clock::now()) {
    std::uint64_t left_out = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (written_ && now - last_ < interval_) {
        ++suppressed_;
        return false;
      }
      written_ = true;
      last_ = now;
      left_out = suppressed_;
      suppressed_ = 0;
    }
    if (left_out == 0) {
      log::write(level_, message);
    } else {
      log::write(level_, std::string(message) + " (" + std::to_string(left_out) +
                             " more since the last line)");
    }
    return true;
  }

 private:
  const log::Level level_;
  const Clock::duration interval_;
  std::mutex mu_;
  bool written_ = false;
  Clock::time_point last_;
  std::uint64_t suppressed_ = 0;
};

}  // namespace libreyolo::server::rpc
