#include "models/runtime/constant_cache.h"

#include "models/runtime/stream_guard.h"

namespace libreyolo::models {

at::Tensor ConstantCache::get(const std::vector<int64_t>& key, const at::Device& device,
                              const std::function<at::Tensor()>& make) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // The device is part of the key: one model object's forwards on two devices (a model moved
  // between them) must not be handed each other's tensors.
  for (const auto& [k, value] : entries_)
    if (k == key && value.device() == device) return value;
  at::Tensor value = make();
  if (entries_.size() >= kMaxEntries || stream_is_capturing(device)) return value;
  // Another stream may read it next: its one-time computation must have run.
  StreamEvent done(device);
  done.record();
  done.synchronize();
  entries_.emplace_back(key, value);
  return value;
}

}  // namespace libreyolo::models
