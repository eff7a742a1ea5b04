// Cancellation of the HTTP infer requests in flight: a socket cannot notify, so one thread
// looks at them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "server/api/types.h"
#include "server/http/fixed_stack_thread.h"

namespace libreyolo::server::http {

/// Notifies the api::CancelToken of every infer request in flight whose client went away
/// (peer_gone) or whose deadline (Triton's `timeout` parameter) passed. The core waits for the
/// token's notification, it does not poll (server/core/infer_pipeline.cpp), and a socket
/// cannot notify: one thread looks at the registered sockets every 20 ms, the way the gRPC
/// side's DeadlineTimer (server/grpc/grpc_server.cpp) serves deadlines.
class PeerWatcher {
 public:
  /// Starts the watching thread with a `stack_bytes` stack.
  explicit PeerWatcher(std::size_t stack_bytes);
  /// Stops and joins the thread.
  ~PeerWatcher();
  PeerWatcher(const PeerWatcher&) = delete;
  PeerWatcher& operator=(const PeerWatcher&) = delete;

  /// Watches socket `fd` (-1: none) and `deadline` for `token` until remove(id).
  std::uint64_t add(int fd, std::optional<std::chrono::steady_clock::time_point> deadline,
                    const std::shared_ptr<api::CancelToken>& token);
  /// Stops watching what add() returned `id` for.
  void remove(std::uint64_t id);

 private:
  struct Entry {
    int fd = -1;
    std::optional<std::chrono::steady_clock::time_point> deadline;
    std::shared_ptr<api::CancelToken> token;
  };
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::unique_ptr<FixedStackThread> thread_;  ///< last: started when the rest exists
};

}  // namespace libreyolo::server::http
