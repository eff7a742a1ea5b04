// Weights packed once for the CPU implementations: oneDNN's blocked format for the `onednn` ones
// (kernels/conv/cpu/conv2d_bias_act_onednn.cpp, kernels/gemm/cpu/linear_act_onednn.cpp),
// Winograd's transformed filters for `winograd` (kernels/conv/cpu/conv2d_bias_act_winograd.cpp),
// and their common bind rules.
//
// A table keyed by the weight tensor (a weak reference, its data pointer and version): an entry is
// made on a weight's first call (the daemon's warm-up forward), made again when the weight was
// replaced or written in place (a layout applied after a forward), and dropped when the weight is
// freed (swept on the next insertion). Memory: one packed copy of every weight that ran (the
// dense one stays for the portable path). Safe to call from concurrent forwards.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>
#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The capability of the CPU `onednn` implementations: CPU float32 models.
inline const char* cpu_float32_models_only(const BindContext& c) {
  if (c.device != BindContext::Device::cpu) return "the model is not on the CPU";
  if (c.dtype != "float32") return "the model is not float32";
  return nullptr;
}

/// Whether this CPU computes bfloat16 natively: AVX-512 BF16 or AMX BF16, as cpuinfo reports
/// them to ATen (at::cpu::get_cpu_capabilities(), keys "avx512_bf16" / "amx_bf16"). The CPUs the
/// daemon's dtype policy picks bfloat16 for (server/instance/dtype_policy.cpp); elsewhere oneDNN
/// emulates bfloat16, slower than float32.
inline bool cpu_has_native_bfloat16() {
  static const bool has = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    const auto flag = [&](const char* key) {
      const auto it = caps.find(key);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    return flag("avx512_bf16") || flag("amx_bf16");
  }();
  return has;
}

/// The capability of the CPU `onednn` convolution and linear_act: CPU float32 models, and bfloat16
/// models on a CPU with native bfloat16 (oneDNN's AMX / AVX-512 BF16 kernels, float32
/// accumulation).
inline const char* cpu_float32_or_native_bfloat16_models(const BindContext& c) {
  if (c.device != BindContext::Device::cpu) return "the model is not on the CPU";
  if (c.dtype == "float32") return nullptr;
  if (c.dtype != "bfloat16") return "the model is not float32 or bfloat16";
  if (!cpu_has_native_bfloat16()) return "bfloat16 on a CPU without avx512_bf16 or amx_bf16";
  return nullptr;
}

/// The capability of the `linear` slot's `onednn`: bfloat16 CPU models on a CPU with native
/// bfloat16 (float32 models keep at::linear's numbers).
inline const char* cpu_native_bfloat16_models(const BindContext& c) {
  if (c.device != BindContext::Device::cpu) return "the model is not on the CPU";
  if (c.dtype != "bfloat16") return "the model is not bfloat16";
  if (!cpu_has_native_bfloat16()) return "bfloat16 on a CPU without avx512_bf16 or amx_bf16";
  return nullptr;
}

/// The packed-weight table. `Key` is what else the packed form depends on (a convolution's
/// geometry, Winograd's tile size; nothing for a linear layer), compared with `KeyEqual`. One
/// entry per weight: a call with another key packs again and replaces it, so a caller's key must
/// not alternate between calls on one weight.
template <class Key, class KeyEqual = std::equal_to<Key>>
class PackedWeights {
 public:
  /// The packed form of `w` for `key`: pack(w) made now if absent or stale, else the cached one.
  template <class Pack>
  at::Tensor get(const at::Tensor& w, const Key& key, Pack&& pack) {
    auto* impl = w.unsafeGetTensorImpl();
    // Inference tensors (a model loaded under InferenceMode) have no version counter; they can
    // only be written inside InferenceMode, which no layout does after loading.
    const int64_t version = w.is_inference() ? -1 : static_cast<int64_t>(w._version());
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto it = table_.find(impl);
      if (it != table_.end() && fresh(it->second, impl, w, version, key)) return it->second.packed;
    }
    // Packed outside the lock (other layers go on); a concurrent first call of the same weight
    // packs it twice, and the later insertion wins (both are equal).
    Entry e{c10::weak_intrusive_ptr<c10::TensorImpl>(w.getIntrusivePtr()), w.data_ptr(), version,
            key, pack(w)};
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = table_.begin(); it != table_.end();) {
      if (it->second.source.expired())
        it = table_.erase(it);
      else
        ++it;
    }
    auto packed = e.packed;
    table_.insert_or_assign(impl, std::move(e));
    return packed;
  }

  /// Entries held now (live or not yet swept): for tests.
  size_t size() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return table_.size();
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> source;
    const void* data;
    int64_t version;
    Key key;
    at::Tensor packed;
  };

  /// The entry still describes `w`: the same live tensor (not a new one at a freed address),
  /// the same storage, not written since, the same key.
  static bool fresh(const Entry& e, const c10::TensorImpl* impl, const at::Tensor& w,
                    int64_t version, const Key& key) {
    auto alive = e.source.lock();
    return alive.get() == impl && e.data == w.data_ptr() && e.version == version &&
           KeyEqual{}(e.key, key);
  }

  std::mutex mutex_;
  std::unordered_map<const c10::TensorImpl*, Entry> table_;
};

}  // namespace libreyolo::kernels
