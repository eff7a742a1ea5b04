#include "server/http/peer_watcher.h"

#include <poll.h>

#include <utility>
#include <vector>

namespace libreyolo::server::http {
namespace {

using Clock = std::chrono::steady_clock;

/// True once the peer closed its side or reset (poll POLLRDHUP/POLLHUP/POLLERR). A client that
/// half-closes after its request counts as gone, as in nginx and Triton's libevhtp.
bool peer_gone(int fd) {
  pollfd p{fd, static_cast<short>(POLLRDHUP), 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

}  // namespace

PeerWatcher::PeerWatcher(std::size_t stack_bytes)
    : thread_(std::make_unique<FixedStackThread>(stack_bytes, [this] { loop(); })) {}

PeerWatcher::~PeerWatcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.reset();  // joins
}

std::uint64_t PeerWatcher::add(int fd, std::optional<Clock::time_point> deadline,
                               const std::shared_ptr<api::CancelToken>& token) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::uint64_t id = next_id_++;
  entries_[id] = Entry{fd, deadline, token};
  cv_.notify_all();
  return id;
}

void PeerWatcher::remove(std::uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  entries_.erase(id);
}

void PeerWatcher::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (entries_.empty()) {
      cv_.wait(lk);
      continue;
    }
    cv_.wait_for(lk, std::chrono::milliseconds(20));
    std::vector<std::pair<std::shared_ptr<api::CancelToken>, api::Code>> due;
    const auto now = Clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      const Entry& e = it->second;
      if (e.deadline && now >= *e.deadline) {
        due.emplace_back(e.token, api::Code::deadline_exceeded);
      } else if (e.fd >= 0 && peer_gone(e.fd)) {
        due.emplace_back(e.token, api::Code::cancelled);
      } else {
        ++it;
        continue;
      }
      it = entries_.erase(it);
    }
    if (due.empty()) continue;
    lk.unlock();  // the callbacks take the core's locks
    for (auto& [token, code] : due) token->cancel(code);
    lk.lock();
  }
}

}  // namespace libreyolo::server::http
