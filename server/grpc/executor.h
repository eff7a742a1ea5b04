// The gRPC transport's bounded pool for blocking handlers (grpc_server.cpp). No gRPC, no torch.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace libreyolo::server::rpc {

/// A bounded pool for the handlers that block (ModelInfer waits for its batch, a model load
/// reads a checkpoint): gRPC's callback threads only hand work over, so a slow call never
/// holds one of them. At most `max_threads` tasks run at once, threads start on demand and stay;
/// a task beyond that is refused at once (the caller answers RESOURCE_EXHAUSTED) instead of
/// waiting with its request in memory, the bound server.max_concurrent_rpcs sets.
class Executor {
 public:
  explicit Executor(int max_threads) : max_(std::max(max_threads, 1)) {}
  ~Executor() { stop(); }

  /// Runs `task` on a pool thread; false (and `task` not run) when max_threads tasks run.
  bool try_submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || busy_ >= max_) return false;
    ++busy_;
    queue_.push_back(std::move(task));
    if (idle_ == 0) {
      threads_.emplace_back([this] { loop(); });
    } else {
      --idle_;  // the woken thread takes it
    }
    cv_.notify_one();
    return true;
  }

  int max_threads() const { return max_; }

  /// Tasks submitted and not finished.
  int busy() {
    std::lock_guard<std::mutex> lk(mu_);
    return busy_;
  }

  /// Waits until no task is queued or running, or until `deadline`; true when none is. (The
  /// stop waits for the calls in flight this way while new ones are refused: grpc_server.cpp.)
  bool wait_idle(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(mu_);
    return idle_cv_.wait_until(lk, deadline, [&] { return busy_ == 0; });
  }

  /// Lets queued and running tasks finish, then joins every thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      task();
      lk.lock();
      --busy_;
      ++idle_;
      if (busy_ == 0) idle_cv_.notify_all();
    }
  }

  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  ///< busy_ reached 0
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int busy_ = 0;  ///< tasks submitted and not finished
  int idle_ = 0;  ///< threads waiting for a task
  bool stopping_ = false;
};

}  // namespace libreyolo::server::rpc
