#include "server/scheduler/batch_job.h"

namespace libreyolo::server {

void fail_all(Batch& batch, api::Code code, const std::string& message) {
  for (auto& j : batch) {
    try {
      j->promise.set_exception(std::make_exception_ptr(api::Error(code, message)));
    } catch (const std::future_error&) {
      // already answered
    }
  }
}

}  // namespace libreyolo::server
