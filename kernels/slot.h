// Typed slot definitions and the handles models call through.
//
// A slot is declared once with its C++ signature (SlotDef<R(Args...)>, like an operator schema
// in torch/library.h); every implementation registered for it must have exactly that signature
// (Registry::register_impl checks it against the declaration). A model does not look slots up by
// name on its hot path: at load it asks the registry to bind (kernelize-style, huggingface/kernels
// `kernelize`): Registry::bind returns a Handle holding the candidates that are allowed by the
// model's policy and capable of the model's device and dtype, in call order. Calling a Handle
// takes no lock and looks nothing up; it walks that short list: a Decline moves on (counted), an
// exception disables the implementation process-wide (one warning, one fallback event; a first
// out-of-memory in a row throws kernels/out_of_memory.h's OutOfMemory), nullopt: portable path.
//
// No torch dependency: signatures are plain C++ types.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace libreyolo::kernels {

class Registry;

/// Returned by an implementation that does not handle this particular input (wrong device,
/// dtype, layout). Not a failure: counted per reason, never warned, the next candidate runs.
/// `reason` must be a string literal (it is stored, not copied).
struct Decline {
  const char* reason;
};

/// What an implementation returns: its result, or a Decline.
template <class R>
using Outcome = std::variant<R, Decline>;

/// What a model binds for: decided once at load, so that implementations which cannot run on
/// this device or dtype are not even candidates (ONNX Runtime's GetCapability).
struct BindContext {
  enum class Device { cpu, cuda, other };
  Device device = Device::cpu;
  int device_index = -1;          ///< -1: none / current
  std::string dtype = "float32";  ///< "float32" | "float16" | "bfloat16"
  std::string model;              ///< the model's name, for reports ("" for the process default)
  std::string instance;           ///< the model instance ("<model>_<i>"), "" for a single one
};

/// Bind-time capability check: nullptr when `impl` can serve models of this context, else the
/// reason (a string literal) it cannot. Must not throw (a throw counts as incapable).
using Capability = std::function<const char*(const BindContext&)>;

/// The capability of implementations that run CUDA tensors only.
inline const char* cuda_models_only(const BindContext& c) {
  return c.device == BindContext::Device::cuda ? nullptr : "the model is not on a CUDA device";
}

/// The capability of implementations that run CPU tensors only.
inline const char* cpu_models_only(const BindContext& c) {
  return c.device == BindContext::Device::cpu ? nullptr : "the model is not on the CPU";
}

/// A slot: its name and signature. Declared once per slot (kernels/*/<slot>.h).
template <class Sig>
struct SlotDef;
template <class R, class... Args>
struct SlotDef<R(Args...)> {
  using Signature = R(Args...);
  using Result = R;
  using Fn = std::function<Outcome<R>(Args...)>;
  const char* name;
};

struct RegistryEntry;  // one registered implementation (registry.cpp)

namespace detail {

/// One candidate of a binding: the registry's entry (process-wide state: disabled flag, global
/// counters) and the binding's own counters (per model).
struct BoundCandidate {
  std::shared_ptr<RegistryEntry> entry;
  const void* fn = nullptr;  ///< the entry's std::function<Outcome<R>(Args...)>
  struct Counters;
  std::shared_ptr<Counters> counters;
};

/// What a Handle points to: immutable after bind, except the counters and the entries'
/// disabled flags (atomics).
struct Binding {
  std::string slot;
  std::string model;
  std::string instance;
  std::vector<BoundCandidate> candidates;
  /// Implementations not bound, with the reason (policy, predicate, capability, disabled).
  std::vector<std::pair<std::string, std::string>> rejected;
  Registry* registry = nullptr;  ///< for fallback events; must outlive the binding
};

// Defined in registry.cpp: the few operations a call needs, none taking the registry's lock.
bool is_disabled(const BoundCandidate& c);
void count_call(const BoundCandidate& c);
void count_decline(const BoundCandidate& c, const char* reason);
void fail(const Binding& b, const BoundCandidate& c, const std::string& reason);

}  // namespace detail

/// Resolved, typed access to one slot for one model. Cheap to copy (shared). A default-
/// constructed Handle is empty: calls return std::nullopt (the portable path runs).
template <class Sig>
class Handle;
template <class R, class... Args>
class Handle<R(Args...)> {
 public:
  using Fn = std::function<Outcome<R>(Args...)>;

  Handle() = default;

  /// Calls the first candidate that neither declines nor fails. std::nullopt: none did (run
  /// the portable path). Thread-safe.
  std::optional<R> operator()(Args... args) const {
    if (!binding_) return std::nullopt;
    for (const auto& c : binding_->candidates) {
      if (detail::is_disabled(c)) continue;
      try {
        auto out = (*static_cast<const Fn*>(c.fn))(args...);
        if (auto* d = std::get_if<Decline>(&out)) {
          detail::count_decline(c, d->reason);
          continue;
        }
        detail::count_call(c);
        return std::move(std::get<R>(out));
      } catch (const std::exception& e) {
        detail::fail(*binding_, c, e.what());
      } catch (...) {
        detail::fail(*binding_, c, "unknown exception");
      }
    }
    return std::nullopt;
  }

  /// True when no candidate was bound (or the handle is default-constructed).
  bool empty() const { return !binding_ || binding_->candidates.empty(); }
  /// The bound state (reports); null for a default-constructed handle.
  const std::shared_ptr<const detail::Binding>& binding() const { return binding_; }

 private:
  friend class Registry;
  explicit Handle(std::shared_ptr<const detail::Binding> b) : binding_(std::move(b)) {}
  std::shared_ptr<const detail::Binding> binding_;
};

}  // namespace libreyolo::kernels
