// A fixed pool of CPU threads for request preprocessing (decode, resize). Torch-free.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace libreyolo::server {

class ThreadPool {
 public:
  /// `threads` <= 0: std::thread::hardware_concurrency() (at least 1). `on_start(n)` runs first
  /// on each worker thread, n being the pool's thread count (a per-thread setting such as
  /// models::use_intra_op_threads); an exception it throws is swallowed: the worker serves with
  /// the default setting.
  explicit ThreadPool(int threads, std::function<void(int)> on_start = {}) {
    int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
    if (n < 1) n = 1;
    for (int i = 0; i < n; ++i)
      workers_.emplace_back([this, on_start, n] {
        if (on_start) {
          try {
            on_start(n);
          } catch (...) {
          }
        }
        loop();
      });
  }

  /// The number of worker threads.
  int size() const { return static_cast<int>(workers_.size()); }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Runs `fn` on a pool thread; its result or exception arrives through the future.
  template <class F>
  auto submit(F fn) -> std::future<decltype(fn())> {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto future = task->get_future();
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return future;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

}  // namespace libreyolo::server
