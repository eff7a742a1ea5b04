// The kernel registry: op slots, their implementations, one resolution, fallbacks.
//
// Modelled on c10::Dispatcher (an op name, kernels per key, fallthrough) and ONNX Runtime's
// execution providers (capability check, then fallback), with LibreYOLO's semantics
// (shared/docs/research/libreyolo-kernels.md section 2): newest registration first, `reference`
// last, predicates that throw are ineligible, runtime failures disable an implementation for the
// rest of the process. Unlike LibreYOLO, the resolution cache is invalidated correctly: any
// register/unregister/filter change drops the snapshot and the next resolve() rebuilds it.
//
// This header has no torch dependency: slots are typed by their C++ signature.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <typeindex>
#include <utility>
#include <variant>
#include <vector>

namespace libreyolo::kernels {

/// Name under which the implementation that defines a slot's numbers is registered.
inline constexpr const char* kReference = "reference";
/// What active() reports for a slot with no eligible implementation.
inline constexpr const char* kUnavailable = "unavailable";

/// Returned by an implementation that does not handle this particular input (wrong device,
/// dtype, layout). Not a failure: counted per reason, never warned, the next candidate runs.
/// `reason` must be a string literal (it is stored, not copied).
struct Decline {
  const char* reason;
};

/// What an implementation returns: its result, or a Decline.
template <class R>
using Outcome = std::variant<R, Decline>;

/// Zero-argument eligibility check, evaluated at resolution (not per call). May throw: a throw is
/// logged once as a warning and counts as ineligible.
using Predicate = std::function<bool()>;

/// Which implementations the policy allows (built by policy.h from YAML and environment).
struct Filter {
  enum class Mode {
    automatic,       ///< every implementation
    reference_only,  ///< LIBREYOLO_KERNELS=off|reference: references only, no provider loaded
    only_name,       ///< LIBREYOLO_KERNELS=<name>: that name plus `reference`
  };
  Mode mode = Mode::automatic;
  std::string name;                                       ///< for only_name (lower case)
  std::map<std::string, std::vector<std::string>> allow;  ///< per slot: allowed names (+reference)
  std::set<std::string> disabled_providers;               ///< e.g. "hub" when hub_kernels is off

  /// True when `impl` of `slot` passes this filter. `reference` always passes.
  bool allows(const std::string& slot, const std::string& impl) const;
  /// True when the named provider's loader may run.
  bool allows_provider(const std::string& provider) const;
};

/// One runtime failure (or provider failure) that disabled an implementation.
struct FallbackEvent {
  std::string slot;
  std::string impl;
  std::string reason;
  std::chrono::system_clock::time_point time;
};

/// State of one implementation of one slot, as reported by /active and the CLI.
struct CandidateReport {
  std::string name;
  bool allowed = false;   ///< passes the policy filter
  bool eligible = false;  ///< allowed, predicate true, not disabled
  std::string reason;     ///< why not eligible ("" when eligible)
  bool disabled = false;  ///< disabled by a runtime failure
  std::uint64_t calls = 0;
  std::map<std::string, std::uint64_t> declined;  ///< per decline reason
};

struct SlotReport {
  std::string slot;
  std::string selected;  ///< first eligible candidate, or kUnavailable
  bool has_reference = false;
  std::vector<CandidateReport> candidates;  ///< newest first, i.e. in call order
};

/// A provider: a loader that registers implementations (in-tree CUDA, hub, plugins). Loaders
/// run at most once, at the first resolve() whose filter allows them; a loader that throws is
/// logged, recorded as a fallback event and never retried.
struct Provider {
  std::string name;
  std::function<void(class Registry&)> load;
};

struct RegistryEntry;  // one registered implementation; defined in registry.cpp

/// Implementation calls made by one thread while a CallRecording lives on it. Work that runs
/// again later without calling the slot (a replayed CUDA graph) is counted by passing this to
/// Registry::count_replayed, so that calls counters and metrics stay honest.
class RecordedCalls {
 public:
  /// Total calls recorded (all slots and implementations).
  std::uint64_t total() const;
  /// Calls recorded for `impl` of `slot`.
  std::uint64_t of(const std::string& slot, const std::string& impl) const;

 private:
  friend class Registry;
  friend class CallRecording;
  std::vector<std::pair<std::shared_ptr<RegistryEntry>, std::uint64_t>> counts_;
};

/// While alive, every call the calling thread makes through any Registry is also recorded here
/// (nested recordings: the innermost records). Not copyable; not shared between threads.
class CallRecording {
 public:
  CallRecording();
  ~CallRecording();
  CallRecording(const CallRecording&) = delete;
  CallRecording& operator=(const CallRecording&) = delete;
  /// What was recorded so far.
  const RecordedCalls& calls() const { return calls_; }

 private:
  friend class Registry;
  RecordedCalls calls_;
  CallRecording* outer_;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// The process registry, with the built-in references and providers installed and the filter
  /// taken from the process environment (defined in kernels/builtin.cpp). The only global
  /// mutable state of the project.
  static Registry& global();

  /// Puts an implementation in front of the slot's list (newest wins). `fn` must be a
  /// std::function<Outcome<R>(Args...)>; every implementation of a slot must have the same
  /// signature (std::logic_error otherwise). Invalidates the resolution.
  template <class R, class... Args>
  void register_impl(const std::string& slot, const std::string& name,
                     std::function<Outcome<R>(Args...)> fn, Predicate predicate = {}) {
    add_entry(slot, name, std::type_index(typeid(Outcome<R>(Args...))),
              std::make_shared<std::function<Outcome<R>(Args...)>>(std::move(fn)),
              std::move(predicate));
  }

  /// Makes `slot` known with no implementation yet, so that active() and report() list it
  /// (as kUnavailable) before any provider registers one. Idempotent.
  void declare_slot(const std::string& slot);

  /// Removes every implementation of `slot` named `name`; returns how many were removed.
  /// Invalidates the resolution.
  int unregister_impl(const std::string& slot, const std::string& name);

  /// Adds a provider (see Provider). Invalidates the resolution.
  void add_provider(Provider provider);

  /// Replaces the policy filter. Invalidates the resolution.
  void set_filter(Filter filter);
  Filter filter() const;

  /// Builds the resolution snapshot if it is stale: runs allowed provider loaders not yet run,
  /// evaluates predicates, orders candidates. Cheap when nothing changed.
  void resolve();

  /// Name of the implementation a call to `slot` tries first, if any.
  std::optional<std::string> resolve(const std::string& slot);

  /// Every allowed and eligible implementation of `slot`, in call order (newest first).
  std::vector<std::string> iter_impls(const std::string& slot);

  /// Every registered slot -> selected implementation name or kUnavailable.
  std::map<std::string, std::string> active();

  /// Full state of every slot (CLI, /active, metrics).
  std::vector<SlotReport> report();

  /// Fallback events so far, oldest first.
  std::vector<FallbackEvent> events() const;

  /// Names of providers whose loader ran (successfully or not).
  std::vector<std::string> loaded_providers() const;

  /// Calls the slot: walks the eligible implementations in order; a Decline moves on (counted);
  /// an exception disables that implementation for the rest of the process (one warning, one
  /// FallbackEvent) and moves on. Returns std::nullopt when nothing resolved or every
  /// implementation declined or failed: the caller then runs its portable path.
  template <class R, class... Args>
  std::optional<R> call(const std::string& slot, Args... args) {
    using Fn = std::function<Outcome<R>(Args...)>;
    const auto key = std::type_index(typeid(Outcome<R>(Args...)));
    for (const auto& entry : candidates(slot, key)) {
      if (is_disabled(*entry)) continue;
      try {
        auto out = (*static_cast<const Fn*>(function_of(*entry)))(args...);
        if (auto* d = std::get_if<Decline>(&out)) {
          count_decline(*entry, d->reason);
          continue;
        }
        count_call(entry);
        return std::move(std::get<R>(out));
      } catch (const std::exception& e) {
        disable(slot, *entry, e.what());
      } catch (...) {
        disable(slot, *entry, "unknown exception");
      }
    }
    return std::nullopt;
  }

  /// call() with the argument types taken from an implementation type, e.g.
  /// `registry.call_as<MsDeformAttnImpl>(kMsDeformAttn, value, shapes, ...)`.
  template <class Impl, class... Args>
  auto call_as(const std::string& slot, Args&&... args) {
    return call_with(static_cast<Impl*>(nullptr), slot, std::forward<Args>(args)...);
  }

  /// Disables `impl` of `slot` for the rest of the process as if it had failed at run time
  /// (used by providers that detect a failure outside a call). Returns false if not found.
  bool disable_impl(const std::string& slot, const std::string& impl, const std::string& reason);

  /// Adds `calls` (a CallRecording's, taken while a CUDA graph was captured) to the calls
  /// counters once, for one replay of that work.
  void count_replayed(const RecordedCalls& calls);

  /// Records a fallback event that is not tied to a registered implementation (a provider that
  /// failed to load, a plugin that could not be opened); logs one warning.
  void record_event(const std::string& slot, const std::string& impl, const std::string& reason);

  using Entry = RegistryEntry;

 private:
  template <class R, class... A, class... Args>
  std::optional<R> call_with(std::function<Outcome<R>(A...)>*, const std::string& slot,
                             Args&&... args) {
    return call<R, A...>(slot, std::forward<Args>(args)...);
  }
  void add_entry(const std::string& slot, const std::string& name, std::type_index signature,
                 std::shared_ptr<void> fn, Predicate predicate);
  std::vector<std::shared_ptr<Entry>> candidates(const std::string& slot, std::type_index key);
  static const void* function_of(const Entry& entry);
  static bool is_disabled(const Entry& entry);
  static void count_call(const std::shared_ptr<Entry>& entry);
  static void count_decline(Entry& entry, const char* reason);
  void disable(const std::string& slot, Entry& entry, const std::string& reason);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace libreyolo::kernels
