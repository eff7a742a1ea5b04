// The kernel registry: typed op slots, their implementations, providers, one resolution, the
// bindings models call through, fallbacks.
//
// Modelled on c10::Dispatcher (an op declared once with its schema, kernels registered against
// it, OperatorHandle resolved once and called without lookups: torch/library.h,
// ATen/core/dispatch/Dispatcher.h) and ONNX Runtime's execution providers (a capability check,
// then fallback: IExecutionProvider::GetCapability), with LibreYOLO's semantics (docs/DESIGN.md
// "Kernel registry"): newest registration first, `reference` last, predicates that throw are
// ineligible, runtime failures (not a first out-of-memory) disable an implementation. Any
// register/unregister/filter change drops the resolution snapshot and the next resolve()
// rebuilds it; bindings made before keep the candidates they were bound to (models hold the
// handles they were bound to) except that a disabled implementation is skipped everywhere.
//
// This header has no torch dependency: slots are typed by their C++ signature (kernels/slot.h).
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
#include <vector>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// Name under which the implementation that defines a slot's numbers is registered.
inline constexpr const char* kReference = "reference";
/// What active() reports for a slot with no eligible implementation.
inline constexpr const char* kUnavailable = "unavailable";

/// Zero-argument eligibility check of the process (a driver, a device present), evaluated at
/// resolution, not per call. May throw: a throw is logged once as a warning and counts as
/// ineligible. What depends on the model (device, dtype) is a Capability (kernels/slot.h).
using Predicate = std::function<bool()>;

/// Per slot: the implementation names allowed (`slots: {ms_deform_attn: {allow: [cuda]}}`);
/// `reference` is always allowed.
using SlotAllow = std::map<std::string, std::vector<std::string>>;

/// Which implementations the policy allows (built by policy.h from YAML and environment).
struct Filter {
  enum class Mode {
    automatic,       ///< every implementation
    reference_only,  ///< LIBREYOLO_KERNELS=off|reference: references only, no provider loaded
    only_name,       ///< LIBREYOLO_KERNELS=<name>: that name plus `reference`
  };
  Mode mode = Mode::automatic;
  std::string name;                          ///< for only_name (lower case)
  SlotAllow allow;                           ///< per slot: allowed names (+reference)
  std::set<std::string> disabled_providers;  ///< e.g. "hub" when hub_kernels is off

  /// True when `impl` of `slot` passes this filter. `reference` always passes.
  bool allows(const std::string& slot, const std::string& impl) const;
  /// True when the named provider's loader may run.
  bool allows_provider(const std::string& provider) const;
  /// This filter with a model's per-slot lists replacing the process's for those slots (the
  /// mode and the providers stay the process's: a model cannot load what the process refused).
  Filter overridden(const SlotAllow& model_allow) const;
};

/// One runtime failure (or provider failure) that disabled an implementation.
struct FallbackEvent {
  std::string slot;
  std::string impl;
  std::string reason;
  std::chrono::system_clock::time_point time;
  std::string model;  ///< the model whose call failed ("" outside a model's binding)
};

/// State of one implementation of one slot, as reported by /active and the CLI.
struct CandidateReport {
  std::string name;
  bool allowed = false;   ///< passes the policy filter
  bool eligible = false;  ///< allowed, predicate (and capability, for a binding) true, not disabled
  std::string reason;     ///< why not eligible ("" when eligible)
  bool disabled = false;  ///< disabled by a runtime failure
  std::uint64_t calls = 0;
  std::map<std::string, std::uint64_t> declined;  ///< per decline reason
};

struct SlotReport {
  std::string slot;
  std::string signature;  ///< the declared C++ signature (demangled where possible)
  std::string selected;   ///< first eligible candidate, or kUnavailable
  bool has_reference = false;
  std::vector<CandidateReport> candidates;  ///< newest first, i.e. in call order
};

/// One model's binding of one slot: what its handle calls, in order, with the model's own
/// counters, and every implementation it does not call with the reason.
struct BindingReport {
  std::string model;
  std::string instance;  ///< BindContext::instance ("" for a model of one instance)
  std::string slot;
  std::string selected;                     ///< first candidate not disabled, or kUnavailable
  std::vector<CandidateReport> candidates;  ///< bound (eligible) first, then the rejected ones
};

/// A provider of implementations (the in-tree `cuda` kernels, `hub` builds, plugins): an
/// object with its own options (given at construction), a capability check and a loader.
/// The registry runs load() at most once, at the first resolve() whose filter allows the
/// provider and whose unavailable() is null; a load() that throws is logged, recorded as a
/// fallback event and never retried.
class Provider {
 public:
  virtual ~Provider() = default;
  /// The name the policy uses ("cuda", "hub", "plugins").
  virtual std::string name() const = 0;
  /// Why this provider cannot load in this process (a string literal), or nullptr.
  virtual const char* unavailable() const { return nullptr; }
  /// Registers this provider's implementations into `registry`.
  virtual void load(class Registry& registry) = 0;
};

/// A provider from a name and a loader (tests, small in-tree providers).
std::shared_ptr<Provider> make_provider(std::string name, std::function<void(Registry&)> load);

/// What happened to one provider.
struct ProviderReport {
  std::string name;
  std::string state;   ///< "loaded" | "failed" | "unavailable" | "disabled by policy" | "pending"
  std::string detail;  ///< the failure or the unavailability reason
};

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
  friend void detail::count_call(const detail::BoundCandidate&);
  struct Count {
    std::shared_ptr<RegistryEntry> entry;                        // process-wide counters
    std::shared_ptr<detail::BoundCandidate::Counters> counters;  // the binding's (model's)
    std::uint64_t n = 0;
  };
  std::vector<Count> counts_;
};

/// While alive, every call the calling thread makes through any Handle is also recorded here
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
  friend void detail::count_call(const detail::BoundCandidate&);
  RecordedCalls calls_;
  CallRecording* outer_;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// The process's registry: every built-in slot declared, the references registered and the
  /// in-tree `cuda` provider added (kernels/builtin.cpp); its filter is the default (automatic)
  /// until kernels::initialize(policy) applies the daemon's policy and adds the policy's
  /// providers (hub, plugins). Never reads the environment. Programs use it explicitly (load
  /// options name the registry a model binds from); tests use their own Registry instances.
  static Registry& process_default();

  /// Declares `slot` with its signature; idempotent for the same signature, std::logic_error
  /// naming the slot when it was declared with another. Declared slots are listed by report()
  /// (kUnavailable) before any implementation exists.
  template <class Sig>
  void declare(const SlotDef<Sig>& slot) {
    declare_entry(slot.name, std::type_index(typeid(Sig)), typeid(Sig).name());
  }

  /// Puts an implementation in front of the slot's list (newest wins). The slot must have been
  /// declared with this signature (std::logic_error naming the slot otherwise). `capability`
  /// decides at bind time whether a model's context can use it (empty: any). Invalidates the
  /// resolution.
  template <class Sig>
  void register_impl(const SlotDef<Sig>& slot, const std::string& name,
                     typename SlotDef<Sig>::Fn fn, Predicate predicate = {},
                     Capability capability = {}) {
    add_entry(slot.name, name, std::type_index(typeid(Sig)),
              std::make_shared<typename SlotDef<Sig>::Fn>(std::move(fn)), std::move(predicate),
              std::move(capability));
  }

  /// Binds `slot` for a model (kernelize): resolves if stale, then keeps, in call order, the
  /// candidates that `filter` allows (the process filter when null; see Filter::overridden),
  /// whose predicate holds, that are not disabled and whose capability accepts `context`. The
  /// handle calls them with no lock and no lookup. The registry must outlive the handle.
  /// std::logic_error when the slot is not declared with this signature.
  template <class Sig>
  Handle<Sig> bind(const SlotDef<Sig>& slot, const BindContext& context,
                   const Filter* filter = nullptr) {
    return Handle<Sig>(bind_entry(slot.name, std::type_index(typeid(Sig)), context, filter));
  }

  /// Removes every implementation of `slot` named `name`; returns how many were removed.
  /// Invalidates the resolution (existing bindings keep theirs).
  int unregister_impl(const std::string& slot, const std::string& name);

  /// Adds a provider (see Provider); one per name (std::logic_error for a second with the same
  /// name). Invalidates the resolution.
  void add_provider(std::shared_ptr<Provider> provider);
  /// True when a provider of that name was added.
  bool has_provider(const std::string& name) const;

  /// Replaces the policy filter. Invalidates the resolution.
  void set_filter(Filter filter);
  Filter filter() const;

  /// Builds the resolution snapshot if it is stale: runs allowed provider loaders not yet run,
  /// evaluates predicates, orders candidates. Cheap when nothing changed.
  void resolve();

  /// Name of the implementation the process default context tries first, if any (reports and
  /// tests; models call through handles).
  std::optional<std::string> resolve(const std::string& slot);

  /// Every allowed and eligible implementation of `slot`, in call order (newest first).
  std::vector<std::string> iter_impls(const std::string& slot);

  /// Every declared slot -> selected implementation name or kUnavailable.
  std::map<std::string, std::string> active();

  /// Full state of every declared slot (CLI, /active, metrics).
  std::vector<SlotReport> report();

  /// Every live binding (handles still held by a model), sorted by model then slot.
  std::vector<BindingReport> bindings() const;

  /// The declared slots.
  std::vector<std::string> declared_slots() const;
  /// Every name the policy may use: `reference`, every registered implementation's, every
  /// provider's (a provider's implementations are named after it, loaded or not).
  std::set<std::string> known_names() const;

  /// Fallback events so far, oldest first.
  std::vector<FallbackEvent> events() const;

  /// Names of providers whose loader ran (successfully or not).
  std::vector<std::string> loaded_providers() const;
  /// Every provider added, with its state.
  std::vector<ProviderReport> providers() const;

  /// Disables `impl` of `slot` for the rest of the process as if it had failed at run time
  /// (used by providers that detect a failure outside a call). Returns false if not found.
  bool disable_impl(const std::string& slot, const std::string& impl, const std::string& reason);

  /// Adds `calls` (a CallRecording's, taken while a CUDA graph was captured) to the calls
  /// counters (process-wide and the bindings') once, for one replay of that work.
  static void count_replayed(const RecordedCalls& calls);

  /// Records a fallback event that is not tied to a registered implementation (a provider that
  /// failed to load, a plugin that could not be opened); logs one warning.
  void record_event(const std::string& slot, const std::string& impl, const std::string& reason);

  using Entry = RegistryEntry;

 private:
  friend void detail::fail(const detail::Binding&, const detail::BoundCandidate&,
                           const std::string&);
  void declare_entry(const std::string& slot, std::type_index signature, const char* type_name);
  void add_entry(const std::string& slot, const std::string& name, std::type_index signature,
                 std::shared_ptr<void> fn, Predicate predicate, Capability capability);
  std::shared_ptr<const detail::Binding> bind_entry(const std::string& slot,
                                                    std::type_index signature,
                                                    const BindContext& context,
                                                    const Filter* filter);
  void disable(const std::string& slot, Entry& entry, const std::string& reason,
               const std::string& model);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace libreyolo::kernels
