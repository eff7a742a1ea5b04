// A thread with a fixed stack size, for every thread of the HTTP port (HttpOptions::stack_bytes:
// LibTorch's static thread-local storage lives at the top of each thread's stack).
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace libreyolo::server::http {

/// A thread with a fixed stack size (std::thread cannot set one).
class FixedStackThread {
 public:
  FixedStackThread(std::size_t stack_bytes, std::function<void()> fn) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack_bytes);
    auto* heap = new std::function<void()>(std::move(fn));
    const int rc = pthread_create(
        &thread_, &attr,
        [](void* arg) -> void* {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(arg));
          (*f)();
          return nullptr;
        },
        heap);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      delete heap;
      throw std::runtime_error(std::string("HTTP: cannot start a thread with a ") +
                               std::to_string(stack_bytes) + "-byte stack: " + std::strerror(rc));
    }
  }
  ~FixedStackThread() { join(); }
  FixedStackThread(const FixedStackThread&) = delete;
  FixedStackThread& operator=(const FixedStackThread&) = delete;
  void join() {
    if (joinable_) pthread_join(thread_, nullptr);
    joinable_ = false;
  }

 private:
  pthread_t thread_{};
  bool joinable_ = true;
};

}  // namespace libreyolo::server::http
