#include "server/api/types.h"

namespace libreyolo::server::api {

const char* code_name(Code code) {
  switch (code) {
    case Code::ok:
      return "OK";
    case Code::cancelled:
      return "CANCELLED";
    case Code::unknown:
      return "UNKNOWN";
    case Code::invalid_argument:
      return "INVALID_ARGUMENT";
    case Code::deadline_exceeded:
      return "DEADLINE_EXCEEDED";
    case Code::not_found:
      return "NOT_FOUND";
    case Code::already_exists:
      return "ALREADY_EXISTS";
    case Code::permission_denied:
      return "PERMISSION_DENIED";
    case Code::resource_exhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::failed_precondition:
      return "FAILED_PRECONDITION";
    case Code::unimplemented:
      return "UNIMPLEMENTED";
    case Code::internal:
      return "INTERNAL";
    case Code::unavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

void CancelToken::cancel(Code reason) {
  std::map<int, Callback> callbacks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (reason_ != Code::ok) return;
    reason_ = reason == Code::ok ? Code::cancelled : reason;
    callbacks.swap(callbacks_);
    runner_ = std::this_thread::get_id();
  }
  for (auto& [id, callback] : callbacks) {
    (void)id;
    try {
      callback();
    } catch (...) {
      // A subscriber's failure must not stop the others nor escape into gRPC's thread.
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    runner_ = std::thread::id();
  }
  done_.notify_all();
}

bool CancelToken::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_ != Code::ok;
}

Code CancelToken::reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}

int CancelToken::subscribe(Callback callback) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (reason_ == Code::ok) {
      const int id = next_id_++;
      callbacks_.emplace(id, std::move(callback));
      return id;
    }
  }
  callback();
  return 0;
}

void CancelToken::unsubscribe(int id) {
  if (id == 0) return;
  std::unique_lock<std::mutex> lk(mu_);
  callbacks_.erase(id);
  // cancel() took the callbacks out before running them: wait while it may still run this one.
  done_.wait(lk,
             [&] { return runner_ == std::thread::id() || runner_ == std::this_thread::get_id(); });
}

}  // namespace libreyolo::server::api
