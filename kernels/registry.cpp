#include "kernels/registry.h"

#include <algorithm>

#include "log/log.h"

namespace libreyolo::kernels {

struct RegistryEntry {
  std::string slot;
  std::string name;
  std::type_index signature;
  std::shared_ptr<void> fn;
  Predicate predicate;
  std::atomic<bool> disabled{false};
  std::atomic<bool> predicate_warned{false};
  std::atomic<std::uint64_t> calls{0};
  std::mutex decline_mutex;
  std::map<std::string, std::uint64_t> declined;

  RegistryEntry(std::string s, std::string n, std::type_index sig, std::shared_ptr<void> f,
                Predicate p)
      : slot(std::move(s)),
        name(std::move(n)),
        signature(sig),
        fn(std::move(f)),
        predicate(std::move(p)) {}
};

namespace {

using EntryPtr = std::shared_ptr<Registry::Entry>;

/// Immutable result of a resolution: per slot, the eligible entries in call order, plus the
/// report of every candidate as it was when resolved.
struct Snapshot {
  std::map<std::string, std::vector<EntryPtr>> order;
  std::map<std::string, std::vector<std::pair<EntryPtr, std::string>>> rejected;  // entry, reason
};

}  // namespace

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

struct Registry::State {
  mutable std::mutex mutex;                            // guards everything below
  std::map<std::string, std::vector<EntryPtr>> slots;  // newest first
  std::vector<Provider> providers;
  std::set<std::string> providers_run;
  Filter filter;
  std::shared_ptr<const Snapshot> snapshot;  // null = stale
  std::vector<FallbackEvent> events;
};

Registry::Registry() : state_(std::make_unique<State>()) {}
Registry::~Registry() = default;

void Registry::add_entry(const std::string& slot, const std::string& name,
                         std::type_index signature, std::shared_ptr<void> fn, Predicate predicate) {
  if (slot.empty() || name.empty()) {
    throw std::invalid_argument("register_impl: slot and implementation names must be non-empty");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& list = state_->slots[slot];
  for (const auto& e : list) {
    if (e->signature != signature) {
      throw std::logic_error("register_impl: implementation '" + name + "' of slot '" + slot +
                             "' has a different signature than '" + e->name + "'");
    }
  }
  list.insert(list.begin(),
              std::make_shared<Entry>(slot, name, signature, std::move(fn), std::move(predicate)));
  state_->snapshot.reset();
}

void Registry::declare_slot(const std::string& slot) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->slots.emplace(slot, std::vector<EntryPtr>{}).second) state_->snapshot.reset();
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

void Registry::add_provider(Provider provider) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->providers.push_back(std::move(provider));
  state_->snapshot.reset();
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
    std::optional<Provider> next;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->snapshot) return;
      for (const auto& p : state_->providers) {
        if (!state_->providers_run.count(p.name) && state_->filter.allows_provider(p.name)) {
          state_->providers_run.insert(p.name);
          next = p;
          break;
        }
      }
    }
    if (!next) break;
    try {
      next->load(*this);
    } catch (const std::exception& e) {
      record_event("*", next->name, std::string("provider failed to load: ") + e.what());
    } catch (...) {
      record_event("*", next->name, "provider failed to load: unknown exception");
    }
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
  for (const auto& e : candidates(slot, typeid(void))) {
    if (!e->disabled.load()) names.push_back(e->name);
  }
  return names;
}

std::vector<EntryPtr> Registry::candidates(const std::string& slot, std::type_index key) {
  std::shared_ptr<const Snapshot> snap;
  for (int attempt = 0; attempt < 8 && !snap; ++attempt) {
    resolve();
    std::lock_guard<std::mutex> lock(state_->mutex);
    snap = state_->snapshot;
  }
  if (!snap) {
    // Registrations keep racing with resolution: fall back to an unfiltered view rather than
    // spin. Cannot happen in the daemon (registration ends at start-up).
    return {};
  }
  auto it = snap->order.find(slot);
  if (it == snap->order.end()) return {};
  if (key != typeid(void) && !it->second.empty() && it->second.front()->signature != key) {
    throw std::logic_error("slot '" + slot + "' called with a signature its implementations lack");
  }
  return it->second;
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
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    snap = state_->snapshot;
    slots = state_->slots;
  }
  std::vector<SlotReport> out;
  for (const auto& [slot, list] : slots) {
    SlotReport r;
    r.slot = slot;
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

std::vector<FallbackEvent> Registry::events() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->events;
}

std::vector<std::string> Registry::loaded_providers() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return {state_->providers_run.begin(), state_->providers_run.end()};
}

const void* Registry::function_of(const Entry& entry) { return entry.fn.get(); }

bool Registry::is_disabled(const Entry& entry) { return entry.disabled.load(); }

namespace {
thread_local CallRecording* t_recording = nullptr;  // innermost CallRecording of this thread
}  // namespace

CallRecording::CallRecording() : outer_(t_recording) { t_recording = this; }
CallRecording::~CallRecording() { t_recording = outer_; }

std::uint64_t RecordedCalls::total() const {
  std::uint64_t n = 0;
  for (const auto& [entry, count] : counts_) n += count;
  return n;
}

std::uint64_t RecordedCalls::of(const std::string& slot, const std::string& impl) const {
  std::uint64_t n = 0;
  for (const auto& [entry, count] : counts_)
    if (entry->slot == slot && entry->name == impl) n += count;
  return n;
}

void Registry::count_call(const std::shared_ptr<Entry>& entry) {
  entry->calls.fetch_add(1, std::memory_order_relaxed);
  if (!t_recording) return;
  auto& counts = t_recording->calls_.counts_;
  for (auto& [e, n] : counts)
    if (e == entry) {
      ++n;
      return;
    }
  counts.emplace_back(entry, 1);
}

void Registry::count_replayed(const RecordedCalls& calls) {
  for (const auto& [entry, count] : calls.counts_)
    entry->calls.fetch_add(count, std::memory_order_relaxed);
}

void Registry::count_decline(Entry& entry, const char* reason) {
  std::lock_guard<std::mutex> lock(entry.decline_mutex);
  ++entry.declined[reason ? reason : "unspecified"];
}

void Registry::disable(const std::string& slot, Entry& entry, const std::string& reason) {
  if (entry.disabled.exchange(true)) return;  // another thread got there first: one warning
  log::warn("kernel " + slot + "/" + entry.name +
            " failed and is disabled for the rest of the process, falling back: " + reason);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->events.push_back({slot, entry.name, reason, std::chrono::system_clock::now()});
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
  for (const auto& e : hits) disable(slot, *e, reason);
  return !hits.empty();
}

void Registry::record_event(const std::string& slot, const std::string& impl,
                            const std::string& reason) {
  log::warn("kernel " + slot + "/" + impl + ": " + reason);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->events.push_back({slot, impl, reason, std::chrono::system_clock::now()});
}

}  // namespace libreyolo::kernels
