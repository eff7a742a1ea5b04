// The gRPC transport's deadline timer (grpc_server.cpp): a call's grpc-timeout becomes a
// notification of its api::CancelToken. No gRPC, no torch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "server/api/types.h"

namespace libreyolo::server::rpc {

/// One thread that cancels tokens when their call's deadline passes (DEADLINE_EXCEEDED through
/// api::CancelToken), so a request waiting in a model's queue is answered at its deadline
/// without anyone polling. Entries hold weak pointers: a call that ended needs no removal, but
/// remove() keeps the map small.
class DeadlineTimer {
 public:
  DeadlineTimer() : thread_([this] { loop(); }) {}
  ~DeadlineTimer() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Cancels `token` with Code::deadline_exceeded at `when`; returns an id for remove().
  std::uint64_t add(std::chrono::steady_clock::time_point when,
                    const std::shared_ptr<api::CancelToken>& token) {
    std::lock_guard<std::mutex> lk(mu_);
    const std::uint64_t id = next_id_++;
    entries_.emplace(std::make_pair(when, id), token);
    cv_.notify_all();
    return id;
  }

  void remove(std::chrono::steady_clock::time_point when, std::uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.erase(std::make_pair(when, id));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        cv_.wait(lk);
        continue;
      }
      const auto first = entries_.begin();
      if (std::chrono::steady_clock::now() < first->first.first) {
        cv_.wait_until(lk, first->first.first);
        continue;
      }
      auto token = first->second.lock();
      entries_.erase(first);
      lk.unlock();
      if (token) token->cancel(api::Code::deadline_exceeded);
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>,
           std::weak_ptr<api::CancelToken>>
      entries_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace libreyolo::server::rpc
