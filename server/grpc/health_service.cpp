#include "server/grpc/health_service.h"

#include <optional>
#include <utility>

namespace libreyolo::server::rpc {

/// One Watch: sends the latest status whenever it changes (one write in flight at a time; a
/// change during a write is sent after it, only the newest value). gRPC deletes it in OnDone.
class HealthService::Watcher final : public grpc::ServerWriteReactor<hpb::HealthCheckResponse> {
 public:
  Watcher(HealthService& service, std::string name) : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  /// push(status) when `service` is the one this call watches.
  void push_if(const std::string& service, hpb::HealthCheckResponse::ServingStatus status) {
    if (service == name_) push(status);
  }

  /// Queues `status` for sending; with `finish`, the call ends (OK) after it.
  void push(hpb::HealthCheckResponse::ServingStatus status, bool finish = false) {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    pending_ = status;
    finish_after_ = finish_after_ || finish;
    if (!writing_) write_next();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lk(mu_);
    writing_ = false;
    if (!ok) {
      finish(grpc::Status::CANCELLED);
      return;
    }
    write_next();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lk(mu_);
    finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lk(service_.mu_);
      service_.watchers_.erase(this);
    }
    delete this;
  }

 private:
  // Under mu_.
  void write_next() {
    if (finished_) return;
    if (pending_) {
      if (*pending_ != last_sent_) {
        response_.set_status(*pending_);
        last_sent_ = *pending_;
        pending_.reset();
        writing_ = true;
        StartWrite(&response_);
        return;
      }
      pending_.reset();
    }
    if (finish_after_) finish(grpc::Status::OK);
  }
  void finish(const grpc::Status& status) {
    if (finished_ || writing_) {
      // A write in flight: OnWriteDone finishes (finish_after_, or !ok -> CANCELLED).
      if (!finished_) finish_after_ = true;
      return;
    }
    finished_ = true;
    Finish(status);
  }

  HealthService& service_;
  const std::string name_;
  std::mutex mu_;
  hpb::HealthCheckResponse response_;
  std::optional<hpb::HealthCheckResponse::ServingStatus> pending_;
  int last_sent_ = -1;
  bool writing_ = false, finish_after_ = false, finished_ = false;
};

namespace {

/// A Watch refused at once (its Finish is called before the handler returns, as gRPC allows).
class Refused final : public grpc::ServerWriteReactor<hpb::HealthCheckResponse> {
 public:
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<hpb::HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const hpb::HealthCheckRequest* in) {
  std::lock_guard<std::mutex> lk(mu_);
  if (watchers_.size() >= max_watches_) {
    auto* refused = new Refused();
    refused->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "too many grpc.health.v1 Watch streams open (" +
                                     std::to_string(max_watches_) +
                                     "): use Check, or close a Watch"));
    return refused;
  }
  auto* w = new Watcher(*this, in->service());
  watchers_.insert(w);
  w->push(status_of(in->service()), shut_down_);
  return w;
}

void HealthService::set(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lk(mu_);
  if (shut_down_) return;
  const auto s =
      serving ? hpb::HealthCheckResponse::SERVING : hpb::HealthCheckResponse::NOT_SERVING;
  status_[service] = s;
  // Watchers only ever read their own service's status; the name is fixed at construction.
  for (auto* w : watchers_) w->push_if(service, s);
}

void HealthService::shutdown() {
  std::lock_guard<std::mutex> lk(mu_);
  shut_down_ = true;
  for (auto& [name, s] : status_) s = hpb::HealthCheckResponse::NOT_SERVING;
  for (auto* w : watchers_) w->push(status_of(w->name()), /*finish=*/true);
}

}  // namespace libreyolo::server::rpc
