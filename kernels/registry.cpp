#include "kernels/registry.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <tuple>
#include <typeinfo>

#include "kernels/out_of_memory.h"
#include "log/log.h"

namespace libreyolo::kernels {

struct RegistryEntry {
  std::string slot;
  std::string name;
  std::type_index signature;
  std::shared_ptr<void> fn;
  Predicate predicate;
  Capability capability;
  std::atomic<bool> disabled{false};
  std::atomic<bool> predicate_warned{false};
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint32_t> oom_streak{0};  ///< out-of-memory failures since the last call
  std::mutex decline_mutex;
  std::map<std::string, std::uint64_t> declined;

  RegistryEntry(std::string s, std::string n, std::type_index sig, std::shared_ptr<void> f,
                Predicate p, Capability c)
      : slot(std::move(s)),
        name(std::move(n)),
        signature(sig),
        fn(std::move(f)),
        predicate(std::move(p)),
        capability(std::move(c)) {}
};

/// A binding's own counters for one candidate (what /active shows per model).
struct detail::BoundCandidate::Counters {
  std::atomic<std::uint64_t> calls{0};
  std::mutex decline_mutex;
  std::map<std::string, std::uint64_t> declined;
};

namespace {

using EntryPtr = std::shared_ptr<Registry::Entry>;

/// Immutable result of a resolution: per slot, the eligible entries in call order, plus the
/// rejected ones with the reason.
struct Snapshot {
  std::map<std::string, std::vector<EntryPtr>> order;
  std::map<std::string, std::vector<std::pair<EntryPtr, std::string>>> rejected;  // entry, reason
};

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && out ? out : name;
  std::free(out);
  return s;
}

void add_decline(std::mutex& m, std::map<std::string, std::uint64_t>& declined,
                 const char* reason) {
  std::lock_guard<std::mutex> lock(m);
  ++declined[reason ? reason : "unspecified"];
}

class FunctionProvider : public Provider {
 public:
  FunctionProvider(std::string name, std::function<void(Registry&)> load)
      : name_(std::move(name)), load_(std::move(load)) {}
  std::string name() const override { return name_; }
  void load(Registry& registry) override { load_(registry); }

 private:
  std::string name_;
  std::function<void(Registry&)> load_;
};

/// Out-of-memory counts per (registry, slot, impl): kept beside the registries (rare events, one
/// lock) so that registry.h, which every model includes, stays as it is. ~Registry drops its own.
struct OomCounts {
  std::mutex mutex;
  std::map<std::tuple<const Registry*, std::string, std::string>, std::uint64_t> counts;
  static OomCounts& get() {
    static auto* c = new OomCounts();  // never destroyed: registries may outlive statics
    return *c;
  }
};

}  // namespace

std::shared_ptr<Provider> make_provider(std::string name, std::function<void(Registry&)> load) {
  return std::make_shared<FunctionProvider>(std::move(name), std::move(load));
}

bool Filter::allows(const std::string& slot, const std::string& impl) const {
  if (impl == kReference) return true;
  if (mode == Mode::reference_only) return false;
  if (mode == Mode::only_name && impl != name) return false;
  auto it = allow.find(slot);
  if (it != allow.end() &&
      std::find(it->second.begin(), it->second.end(), impl) == it->second.end()) {
    return false;
  }
  return true;
}

bool Filter::allows_provider(const std::string& provider) const {
  if (mode == Mode::reference_only) return false;
  return disabled_providers.count(provider) == 0;
}

Filter Filter::overridden(const SlotAllow& model_allow) const {
  Filter f = *this;
  for (const auto& [slot, names] : model_allow) f.allow[slot] = names;
  return f;
}

struct Registry::State {
  struct Declared {
    std::type_index signature;
    std::string type_name;
  };
  struct ProviderState {
    std::shared_ptr<Provider> provider;
    std::string state = "pending";
    std::string detail;
  };
  mutable std::mutex mutex;  // guards everything below
  std::map<std::string, Declared> declared;
  std::map<std::string, std::vector<EntryPtr>> slots;  // newest first
  std::vector<ProviderState> providers;
  Filter filter;
  std::shared_ptr<const Snapshot> snapshot;  // null = stale
  std::vector<FallbackEvent> events;
  std::vector<std::weak_ptr<const detail::Binding>> bindings;
};

Registry::Registry() : state_(std::make_unique<State>()) {}
Registry::~Registry() {
  auto& c = OomCounts::get();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto it = c.counts.begin(); it != c.counts.end();)
    it = std::get<0>(it->first) == this ? c.counts.erase(it) : std::next(it);
}

void Registry::declare_entry(const std::string& slot, std::type_index signature,
                             const char* type_name) {
  if (slot.empty()) throw std::invalid_argument("declare: a slot needs a name");
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->declared.find(slot);
  if (it != state_->declared.end()) {
    if (it->second.signature != signature) {
      throw std::logic_error("declare: slot '" + slot + "' is already declared as " +
                             it->second.type_name + ", not " + demangle(type_name));
    }
    return;
  }
  state_->declared.emplace(slot, State::Declared{signature, demangle(type_name)});
  state_->slots.emplace(slot, std::vector<EntryPtr>{});
  state_->snapshot.reset();
}

void Registry::add_entry(const std::string& slot, const std::string& name,
                         std::type_index signature, std::shared_ptr<void> fn, Predicate predicate,
                         Capability capability) {
  if (slot.empty() || name.empty()) {
    throw std::invalid_argument("register_impl: slot and implementation names must be non-empty");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->declared.find(slot);
  if (it == state_->declared.end()) {
    throw std::logic_error("register_impl: implementation '" + name + "' of slot '" + slot +
                           "': the slot is not declared");
  }
  if (it->second.signature != signature) {
    throw std::logic_error("register_impl: implementation '" + name + "' of slot '" + slot +
                           "' does not have the slot's signature " + it->second.type_name);
  }
  auto& list = state_->slots[slot];
  list.insert(list.begin(), std::make_shared<Entry>(slot, name, signature, std::move(fn),
                                                    std::move(predicate), std::move(capability)));
  state_->snapshot.reset();
}

int Registry::unregister_impl(const std::string& slot, const std::string& name) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->slots.find(slot);
  if (it == state_->slots.end()) return 0;
  auto& list = it->second;
  auto before = list.size();
  list.erase(
      std::remove_if(list.begin(), list.end(), [&](const EntryPtr& e) { return e->name == name; }),
      list.end());
  int removed = static_cast<int>(before - list.size());
  if (removed > 0) state_->snapshot.reset();
  return removed;
}

void Registry::add_provider(std::shared_ptr<Provider> provider) {
  if (!provider) throw std::invalid_argument("add_provider: null provider");
  const std::string name = provider->name();
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& p : state_->providers) {
    if (p.provider->name() == name)
      throw std::logic_error("add_provider: a provider named '" + name + "' was already added");
  }
  state_->providers.push_back({std::move(provider)});
  state_->snapshot.reset();
}

bool Registry::has_provider(const std::string& name) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& p : state_->providers)
    if (p.provider->name() == name) return true;
  return false;
}

void Registry::set_filter(Filter filter) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->filter = std::move(filter);
  state_->snapshot.reset();
}

Filter Registry::filter() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->filter;
}

void Registry::resolve() {
  // 1. Providers: run outside the lock, since their loaders call register_impl.
  for (;;) {
    std::shared_ptr<Provider> next;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->snapshot) return;
      for (size_t i = 0; i < state_->providers.size(); ++i) {
        auto& p = state_->providers[i];
        if (p.state != "pending" && p.state != "disabled by policy") continue;
        if (!state_->filter.allows_provider(p.provider->name())) {
          p.state = "disabled by policy";
          continue;
        }
        if (const char* why = p.provider->unavailable()) {
          p.state = "unavailable";
          p.detail = why;
          continue;
        }
        p.state = "loading";
        next = p.provider;
        index = i;
        break;
      }
    }
    if (!next) break;
    std::string failure;
    try {
      next->load(*this);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "unknown exception";
    }
    if (!failure.empty()) record_event("*", next->name(), "provider failed to load: " + failure);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->providers[index].state = failure.empty() ? "loaded" : "failed";
    state_->providers[index].detail = failure;
  }

  // 2. Predicates: evaluated outside the lock too (they may be slow or log).
  std::map<std::string, std::vector<EntryPtr>> slots;
  Filter filter;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->snapshot) return;
    slots = state_->slots;
    filter = state_->filter;
  }
  auto snap = std::make_shared<Snapshot>();
  for (const auto& [slot, list] : slots) {
    auto& order = snap->order[slot];
    auto& rejected = snap->rejected[slot];
    for (const auto& e : list) {
      if (!filter.allows(slot, e->name)) {
        rejected.emplace_back(e, "excluded by policy");
        continue;
      }
      if (e->disabled.load()) {
        rejected.emplace_back(e, "disabled after a runtime failure");
        continue;
      }
      bool ok = true;
      std::string reason;
      if (e->predicate) {
        try {
          ok = e->predicate();
          if (!ok) reason = "predicate false";
        } catch (const std::exception& ex) {
          ok = false;
          reason = std::string("predicate threw: ") + ex.what();
        } catch (...) {
          ok = false;
          reason = "predicate threw: unknown exception";
        }
        if (!ok && reason.rfind("predicate threw", 0) == 0 && !e->predicate_warned.exchange(true)) {
          log::warn("kernel predicate failed for " + slot + "/" + e->name + ": " +
                    reason.substr(17));
        }
      }
      if (ok) {
        order.push_back(e);
      } else {
        rejected.emplace_back(e, reason);
      }
    }
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  // A registration that raced with this resolution leaves the snapshot stale; the next call
  // resolves again. Only install ours when nothing changed meanwhile.
  if (!state_->snapshot && slots == state_->slots) state_->snapshot = std::move(snap);
}

std::optional<std::string> Registry::resolve(const std::string& slot) {
  auto names = iter_impls(slot);
  if (names.empty()) return std::nullopt;
  return names.front();
}

std::vector<std::string> Registry::iter_impls(const std::string& slot) {
  std::vector<std::string> names;
  for (const auto& r : report()) {
    if (r.slot != slot) continue;
    for (const auto& c : r.candidates)
      if (c.eligible) names.push_back(c.name);
  }
  return names;
}

std::shared_ptr<const detail::Binding> Registry::bind_entry(const std::string& slot,
                                                            std::type_index signature,
                                                            const BindContext& context,
                                                            const Filter* model_filter) {
  // Null only while registrations keep racing with resolution (never in the daemon, whose
  // registrations end at start-up): the binding is then empty and the model runs portably.
  std::shared_ptr<const Snapshot> snap;
  for (int attempt = 0; attempt < 8 && !snap; ++attempt) {
    resolve();
    std::lock_guard<std::mutex> lock(state_->mutex);
    snap = state_->snapshot;
  }
  Filter process_filter;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->declared.find(slot);
    if (it == state_->declared.end())
      throw std::logic_error("bind: slot '" + slot + "' is not declared");
    if (it->second.signature != signature)
      throw std::logic_error("bind: slot '" + slot + "' is declared as " + it->second.type_name +
                             ", bound with another signature");
    process_filter = state_->filter;
  }
  auto binding = std::make_shared<detail::Binding>();
  binding->slot = slot;
  binding->model = context.model;
  binding->instance = context.instance;
  binding->registry = this;
  if (snap) {
    const Filter& filter = model_filter ? *model_filter : process_filter;
    for (const auto& [e, why] : snap->rejected.at(slot))
      if (filter.allows(slot, e->name)) binding->rejected.emplace_back(e->name, why);
    for (const auto& e : snap->order.at(slot)) {
      if (!filter.allows(slot, e->name)) {
        binding->rejected.emplace_back(e->name, "excluded by the model's policy");
        continue;
      }
      if (e->disabled.load()) {
        binding->rejected.emplace_back(e->name, "disabled after a runtime failure");
        continue;
      }
      const char* incapable = nullptr;
      if (e->capability) {
        try {
          incapable = e->capability(context);
        } catch (...) {
          incapable = "capability check threw";
        }
      }
      if (incapable) {
        binding->rejected.emplace_back(e->name, incapable);
        continue;
      }
      binding->candidates.push_back(
          {e, e->fn.get(), std::make_shared<detail::BoundCandidate::Counters>()});
    }
    // Excluded by the process policy: listed too, so a model's report is complete.
    for (const auto& [e, why] : snap->rejected.at(slot))
      if (!filter.allows(slot, e->name))
        binding->rejected.emplace_back(
            e->name, model_filter ? "excluded by the model's policy" : "excluded by policy");
  }
  std::shared_ptr<const detail::Binding> out = binding;
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& live = state_->bindings;
  live.erase(std::remove_if(live.begin(), live.end(), [](const auto& w) { return w.expired(); }),
             live.end());
  live.push_back(out);
  return out;
}

std::map<std::string, std::string> Registry::active() {
  std::map<std::string, std::string> out;
  for (const auto& r : report()) out[r.slot] = r.selected;
  return out;
}

std::vector<SlotReport> Registry::report() {
  resolve();
  std::shared_ptr<const Snapshot> snap;
  std::map<std::string, std::vector<EntryPtr>> slots;
  std::map<std::string, std::string> signatures;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    snap = state_->snapshot;
    slots = state_->slots;
    for (const auto& [name, d] : state_->declared) signatures[name] = d.type_name;
  }
  std::vector<SlotReport> out;
  for (const auto& [slot, list] : slots) {
    SlotReport r;
    r.slot = slot;
    r.signature = signatures[slot];
    r.selected = kUnavailable;
    for (const auto& e : list) {
      CandidateReport c;
      c.name = e->name;
      c.disabled = e->disabled.load();
      c.calls = e->calls.load();
      {
        std::lock_guard<std::mutex> lock(e->decline_mutex);
        c.declined = e->declined;
      }
      if (e->name == kReference) r.has_reference = true;
      c.allowed = true;
      c.eligible = false;
      if (snap) {
        auto& order = snap->order.at(slot);
        bool in_order = std::find(order.begin(), order.end(), e) != order.end();
        if (in_order && !c.disabled) {
          c.eligible = true;
          if (r.selected == kUnavailable) r.selected = e->name;
        } else if (c.disabled) {
          c.reason = "disabled after a runtime failure";
        } else {
          for (const auto& [re, why] : snap->rejected.at(slot)) {
            if (re == e) {
              c.reason = why;
              c.allowed = why != "excluded by policy";
            }
          }
        }
      }
      r.candidates.push_back(std::move(c));
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<BindingReport> Registry::bindings() const {
  std::vector<std::shared_ptr<const detail::Binding>> live;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (const auto& w : state_->bindings)
      if (auto b = w.lock()) live.push_back(std::move(b));
  }
  std::vector<BindingReport> out;
  for (const auto& b : live) {
    BindingReport r;
    r.model = b->model;
    r.instance = b->instance;
    r.slot = b->slot;
    r.selected = kUnavailable;
    for (const auto& c : b->candidates) {
      CandidateReport cr;
      cr.name = c.entry->name;
      cr.allowed = true;
      cr.disabled = c.entry->disabled.load();
      cr.eligible = !cr.disabled;
      if (cr.disabled) cr.reason = "disabled after a runtime failure";
      cr.calls = c.counters->calls.load();
      {
        std::lock_guard<std::mutex> lock(c.counters->decline_mutex);
        cr.declined = c.counters->declined;
      }
      if (cr.eligible && r.selected == kUnavailable) r.selected = cr.name;
      r.candidates.push_back(std::move(cr));
    }
    for (const auto& [name, why] : b->rejected) {
      CandidateReport cr;
      cr.name = name;
      cr.reason = why;
      cr.allowed = why.find("excluded by") == std::string::npos;
      r.candidates.push_back(std::move(cr));
    }
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const BindingReport& a, const BindingReport& b) {
    return std::tie(a.model, a.instance, a.slot) < std::tie(b.model, b.instance, b.slot);
  });
  return out;
}

std::vector<std::string> Registry::declared_slots() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string> out;
  for (const auto& [name, d] : state_->declared) out.push_back(name);
  return out;
}

std::set<std::string> Registry::known_names() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::set<std::string> out{kReference};
  for (const auto& [slot, list] : state_->slots)
    for (const auto& e : list) out.insert(e->name);
  for (const auto& p : state_->providers) out.insert(p.provider->name());
  return out;
}

std::vector<FallbackEvent> Registry::events() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->events;
}

std::vector<std::string> Registry::loaded_providers() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string> out;
  for (const auto& p : state_->providers)
    if (p.state == "loaded" || p.state == "failed") out.push_back(p.provider->name());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ProviderReport> Registry::providers() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<ProviderReport> out;
  for (const auto& p : state_->providers) out.push_back({p.provider->name(), p.state, p.detail});
  return out;
}

namespace {
thread_local CallRecording* t_recording = nullptr;  // innermost CallRecording of this thread
}  // namespace

CallRecording::CallRecording() : outer_(t_recording) { t_recording = this; }
CallRecording::~CallRecording() { t_recording = outer_; }

std::uint64_t RecordedCalls::total() const {
  std::uint64_t n = 0;
  for (const auto& c : counts_) n += c.n;
  return n;
}

std::uint64_t RecordedCalls::of(const std::string& slot, const std::string& impl) const {
  std::uint64_t n = 0;
  for (const auto& c : counts_)
    if (c.entry->slot == slot && c.entry->name == impl) n += c.n;
  return n;
}

bool detail::is_disabled(const BoundCandidate& c) {
  return c.entry->disabled.load(std::memory_order_relaxed);
}

void detail::count_call(const BoundCandidate& c) {
  c.entry->calls.fetch_add(1, std::memory_order_relaxed);
  // Load first: the store (a shared cache line written on every call) only after an OOM.
  if (c.entry->oom_streak.load(std::memory_order_relaxed) != 0)
    c.entry->oom_streak.store(0, std::memory_order_relaxed);
  c.counters->calls.fetch_add(1, std::memory_order_relaxed);
  if (!t_recording) return;
  auto& counts = t_recording->calls_.counts_;
  for (auto& rc : counts)
    if (rc.counters == c.counters) {
      ++rc.n;
      return;
    }
  counts.push_back({c.entry, c.counters, 1});
}

void detail::count_decline(const BoundCandidate& c, const char* reason) {
  add_decline(c.entry->decline_mutex, c.entry->declined, reason);
  add_decline(c.counters->decline_mutex, c.counters->declined, reason);
}

OutOfMemory::OutOfMemory(const std::string& slot, const std::string& impl, const std::string& error)
    : std::runtime_error("kernel " + slot + "/" + impl +
                         " ran out of memory: " + error.substr(0, error.find('\n'))),
      slot_(slot),
      impl_(impl) {}

bool is_out_of_memory(const std::exception& e) {
  // typeid(c10::OutOfMemoryError).name() under the Itanium ABI (GCC, Clang).
  return std::string_view(typeid(e).name()) == "N3c1016OutOfMemoryErrorE" ||
         std::string_view(e.what()).find("out of memory") != std::string_view::npos;
}

namespace {

/// The exception being handled when it is an out-of-memory, else null (called in a catch).
const std::exception* handled_out_of_memory() {
  try {
    if (auto ep = std::current_exception()) std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return is_out_of_memory(e) ? &e : nullptr;  // the object outlives this handler
  } catch (...) {
  }
  return nullptr;
}

}  // namespace

std::uint64_t out_of_memory_count(const Registry& registry, const std::string& slot,
                                  const std::string& impl) {
  auto& c = OomCounts::get();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.counts.find({&registry, slot, impl});
  return it == c.counts.end() ? 0 : it->second;
}

// Called by Handle::operator() inside its catch handler (kernels/slot.h), so the exception is
// the current one: an out-of-memory is counted, and the first in a row is thrown on as
// OutOfMemory instead of disabling the implementation (kernels/out_of_memory.h).
void detail::fail(const Binding& b, const BoundCandidate& c, const std::string& reason) {
  if (const std::exception* e = handled_out_of_memory()) {
    {
      auto& counts = OomCounts::get();
      std::lock_guard<std::mutex> lock(counts.mutex);
      ++counts.counts[{b.registry, b.slot, c.entry->name}];
    }
    // Two threads failing at once count as two in a row: the second disables.
    if (c.entry->oom_streak.fetch_add(1, std::memory_order_relaxed) == 0) {
      OutOfMemory oom(b.slot, c.entry->name, e->what());
      log::warn(std::string(oom.what()) + (b.model.empty() ? "" : " (in model " + b.model + ")") +
                "; the call fails, the implementation stays (a second one in a row disables it)");
      throw oom;
    }
  }
  if (b.registry) b.registry->disable(b.slot, *c.entry, reason, b.model);
}

void Registry::count_replayed(const RecordedCalls& calls) {
  for (const auto& c : calls.counts_) {
    c.entry->calls.fetch_add(c.n, std::memory_order_relaxed);
    c.counters->calls.fetch_add(c.n, std::memory_order_relaxed);
  }
}

void Registry::disable(const std::string& slot, Entry& entry, const std::string& reason,
                       const std::string& model) {
  if (entry.disabled.exchange(true)) return;  // another thread got there first: one warning
  log::warn("kernel " + slot + "/" + entry.name +
            " failed and is disabled for the rest of the process, falling back" +
            (model.empty() ? "" : " (in model " + model + ")") + ": " + reason);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->events.push_back({slot, entry.name, reason, std::chrono::system_clock::now(), model});
  state_->snapshot.reset();
}

bool Registry::disable_impl(const std::string& slot, const std::string& impl,
                            const std::string& reason) {
  std::vector<EntryPtr> hits;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->slots.find(slot);
    if (it == state_->slots.end()) return false;
    for (const auto& e : it->second) {
      if (e->name == impl) hits.push_back(e);
    }
  }
  for (const auto& e : hits) disable(slot, *e, reason, "");
  return !hits.empty();
}

void Registry::record_event(const std::string& slot, const std::string& impl,
                            const std::string& reason) {
  log::warn("kernel " + slot + "/" + impl + ": " + reason);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->events.push_back({slot, impl, reason, std::chrono::system_clock::now(), ""});
}

}  // namespace libreyolo::kernels
