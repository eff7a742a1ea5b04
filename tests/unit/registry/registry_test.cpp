// Registry semantics: selection order, forcing, provider loaders, runtime fallback and declines,
// signatures, concurrent calls. Each test uses its own Registry; slots here are typed int(int)
// so the tests need no torch.
#include "kernels/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "log/log.h"

namespace libreyolo::kernels {
namespace {

using Impl = std::function<Outcome<int>(int)>;

/// An implementation that returns x + offset.
Impl adds(int offset) {
  return [offset](int x) -> Outcome<int> { return x + offset; };
}

constexpr SlotDef<int(int)> kOp{"op"}, kMs{"ms"}, kOther{"other"}, kOp2{"op2"},
    kMsdaSlot{"ms_deform_attn"};

/// Declares `slot` (idempotent) and registers `fn` as `name`.
void add(Registry& r, const SlotDef<int(int)>& slot, const std::string& name, Impl fn,
         Predicate predicate = {}) {
  r.declare(slot);
  r.register_impl(slot, name, std::move(fn), std::move(predicate));
}

/// One call through a fresh binding of the process context (what a model's handle does).
std::optional<int> run(Registry& r, const SlotDef<int(int)>& slot, int x) {
  return r.bind(slot, BindContext{})(x);
}

TEST(Registry, NewestRegistrationWinsAndReferenceIsLast) {
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "a", Impl(adds(100)));
  add(r, kOp, "b", Impl(adds(200)));
  EXPECT_EQ(r.iter_impls("op"), (std::vector<std::string>{"b", "a", "reference"}));
  EXPECT_EQ(r.resolve("op"), "b");
  EXPECT_EQ(run(r, kOp, 1), 201);
  EXPECT_EQ(r.active().at("op"), "b");
}

TEST(Registry, ForcingANameKeepsTheReferenceAsFallback) {
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "cuda", Impl(adds(100)));
  add(r, kOp, "hub", Impl(adds(200)));
  Filter f;
  f.mode = Filter::Mode::only_name;
  f.name = "cuda";
  r.set_filter(f);
  EXPECT_EQ(r.iter_impls("op"), (std::vector<std::string>{"cuda", "reference"}));
  EXPECT_EQ(run(r, kOp, 1), 101);
  f.name = "triton";  // a name nobody registered: only the reference remains
  r.set_filter(f);
  EXPECT_EQ(r.iter_impls("op"), (std::vector<std::string>{"reference"}));
  EXPECT_EQ(r.active().at("op"), "reference");
}

TEST(Registry, ActiveIsUnavailableWithoutAnEligibleImplementation) {
  Registry r;
  add(r, kMs, "cuda", Impl(adds(1)), [] { return false; });
  EXPECT_EQ(r.active().at("ms"), kUnavailable);
  EXPECT_EQ(r.resolve("ms"), std::nullopt);
  EXPECT_EQ(run(r, kMs, 1), std::nullopt);  // caller keeps its portable path
  auto rep = r.report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_FALSE(rep[0].has_reference);
  ASSERT_EQ(rep[0].candidates.size(), 1u);
  EXPECT_EQ(rep[0].candidates[0].reason, "predicate false");
}

TEST(Registry, ThrowingPredicateWarnsOnceAndIsIneligible) {
  log::Capture capture;
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "bad", Impl(adds(5)), []() -> bool { throw std::runtime_error("no driver"); });
  EXPECT_EQ(r.resolve("op"), "reference");
  EXPECT_EQ(run(r, kOp, 1), 1);
  // Re-resolution (a registration elsewhere invalidates the snapshot) must not warn again.
  add(r, kOther, kReference, Impl(adds(0)));
  EXPECT_EQ(r.resolve("op"), "reference");
  EXPECT_EQ(capture.count(log::Level::warn, "kernel predicate failed for op/bad: no driver"), 1);
  auto rep = r.report();
  EXPECT_EQ(rep[0].candidates[0].name, "bad");
  EXPECT_EQ(rep[0].candidates[0].reason, "predicate threw: no driver");
}

TEST(Registry, ReferenceOnlyFilterNeverRunsProviderLoaders) {
  for (const auto mode : {Filter::Mode::reference_only}) {
    Registry r;
    int loads = 0;
    add(r, kOp, kReference, Impl(adds(0)));
    r.add_provider(make_provider("cuda", [&loads](Registry& reg) {
      ++loads;
      add(reg, kOp, "cuda", Impl(adds(100)));
    }));
    Filter f;
    f.mode = mode;
    r.set_filter(f);
    EXPECT_EQ(r.resolve("op"), "reference");
    EXPECT_EQ(run(r, kOp, 1), 1);
    r.report();
    EXPECT_EQ(loads, 0);
    EXPECT_TRUE(r.loaded_providers().empty());
    // Back to automatic: the loader runs exactly once, however often we resolve.
    r.set_filter(Filter{});
    EXPECT_EQ(r.resolve("op"), "cuda");
    EXPECT_EQ(r.resolve("op"), "cuda");
    EXPECT_EQ(loads, 1);
    EXPECT_EQ(r.loaded_providers(), (std::vector<std::string>{"cuda"}));
  }
}

TEST(Registry, DisabledProviderIsNotLoaded) {
  Registry r;
  int loads = 0;
  r.add_provider(make_provider("hub", [&loads](Registry&) { ++loads; }));
  Filter f;
  f.disabled_providers = {"hub"};
  r.set_filter(f);
  r.resolve();
  EXPECT_EQ(loads, 0);
}

TEST(Registry, ProviderThatThrowsIsRecordedAndNotRetried) {
  log::Capture capture;
  Registry r;
  int loads = 0;
  add(r, kOp, kReference, Impl(adds(0)));
  r.add_provider(make_provider("broken", [&loads](Registry&) {
    ++loads;
    throw std::runtime_error("libcuda.so.1: cannot open shared object file");
  }));
  EXPECT_EQ(r.resolve("op"), "reference");
  add(r, kOp2, kReference, Impl(adds(0)));
  r.resolve();
  EXPECT_EQ(loads, 1);
  ASSERT_EQ(r.events().size(), 1u);
  EXPECT_EQ(r.events()[0].impl, "broken");
  EXPECT_EQ(r.events()[0].reason,
            "provider failed to load: libcuda.so.1: cannot open shared object file");
  EXPECT_EQ(capture.count(log::Level::warn, "provider failed to load"), 1);
}

TEST(Registry, RegisterAndUnregisterAfterResolutionAreSeenByTheNextResolve) {
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  EXPECT_EQ(r.resolve("op"), "reference");
  add(r, kOp, "late", Impl(adds(9)));
  EXPECT_EQ(r.resolve("op"), "late");  // LibreYOLO's cache would still say "reference"
  EXPECT_EQ(run(r, kOp, 1), 10);
  EXPECT_EQ(r.unregister_impl("op", "late"), 1);
  EXPECT_EQ(r.resolve("op"), "reference");
  EXPECT_EQ(run(r, kOp, 1), 1);
  EXPECT_EQ(r.unregister_impl("op", "late"), 0);
}

TEST(Registry, ImplementationsAreCheckedAgainstTheDeclaredSignature) {
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  constexpr SlotDef<float(float)> kOpAsFloat{"op"};
  try {
    r.register_impl(kOpAsFloat, "x", [](float v) -> Outcome<float> { return v; });
    FAIL() << "registered with another signature";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "register_impl: implementation 'x' of slot 'op' does not have the slot's "
              "signature int (int)");
  }
  EXPECT_THROW(r.declare(kOpAsFloat), std::logic_error);
  EXPECT_THROW(r.bind(kOpAsFloat, BindContext{}), std::logic_error);
  constexpr SlotDef<int(int)> kUndeclared{"nobody_declared_me"};
  try {
    r.register_impl(kUndeclared, "x", Impl(adds(1)));
    FAIL() << "registered into an undeclared slot";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "register_impl: implementation 'x' of slot 'nobody_declared_me': the slot is not "
              "declared");
  }
}

TEST(Registry, RuntimeFailureFallsBackDisablesWarnsOnceAndRecordsAnEvent) {
  log::Capture capture;
  Registry r;
  int failing_calls = 0;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "cuda", Impl([&failing_calls](int) -> Outcome<int> {
        ++failing_calls;
        throw std::runtime_error("CUDA error: an illegal memory access");
      }));
  EXPECT_EQ(r.active().at("op"), "cuda");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(run(r, kOp, i), i);  // right answer every time
  EXPECT_EQ(failing_calls, 1);                               // never retried
  EXPECT_EQ(r.active().at("op"), "reference");
  EXPECT_EQ(capture.count(log::Level::warn), 1);
  EXPECT_EQ(capture.count(log::Level::warn, "kernel op/cuda failed"), 1);
  auto ev = r.events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].slot, "op");
  EXPECT_EQ(ev[0].impl, "cuda");
  EXPECT_EQ(ev[0].reason, "CUDA error: an illegal memory access");
  EXPECT_LE(ev[0].time, std::chrono::system_clock::now());
  auto rep = r.report();
  EXPECT_TRUE(rep[0].candidates[0].disabled);
  EXPECT_EQ(rep[0].candidates[0].reason, "disabled after a runtime failure");
  EXPECT_EQ(rep[0].candidates[1].calls, 5u);
}

TEST(Registry, DeclineIsCountedNotWarned) {
  log::Capture capture;
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "cuda", Impl([](int x) -> Outcome<int> {
        if (x < 0) return Decline{"cpu tensor"};
        return x * 10;
      }));
  EXPECT_EQ(run(r, kOp, -1), -1);
  EXPECT_EQ(run(r, kOp, -2), -2);
  EXPECT_EQ(run(r, kOp, 3), 30);
  EXPECT_EQ(capture.count(log::Level::warn), 0);
  EXPECT_EQ(r.active().at("op"), "cuda");  // a decline does not disable
  auto rep = r.report();
  EXPECT_EQ(rep[0].candidates[0].declined.at("cpu tensor"), 2u);
  EXPECT_EQ(rep[0].candidates[0].calls, 1u);
  EXPECT_EQ(rep[0].candidates[1].calls, 2u);
  EXPECT_TRUE(r.events().empty());
}

TEST(Registry, EveryImplementationDecliningReturnsNothing) {
  Registry r;
  add(r, kMs, "second", Impl([](int) -> Outcome<int> { return 7; }));
  add(r, kMs, "first", Impl([](int) -> Outcome<int> { return Decline{"layout"}; }));
  EXPECT_EQ(run(r, kMs, 0), 7);  // the walk reaches the older provider
  r.unregister_impl("ms", "second");
  EXPECT_EQ(run(r, kMs, 0), std::nullopt);
}

TEST(Registry, ConcurrentCallsWhileAnImplementationSelfDisables) {
  log::Capture capture;
  Registry r;
  std::atomic<int> flaky_calls{0};
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "flaky", Impl([&flaky_calls](int x) -> Outcome<int> {
        if (flaky_calls.fetch_add(1) >= 100) throw std::runtime_error("device lost");
        return x;  // same numbers as the reference while it works
      }));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const int x = t * 1000 + i;
        if (run(r, kOp, x) != x) ++wrong;
        if (i % 50 == 0) {
          r.resolve("op");
          r.active();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(r.active().at("op"), "reference");
  EXPECT_EQ(r.events().size(), 1u);
  EXPECT_EQ(capture.count(log::Level::warn, "kernel op/flaky failed"), 1);
}

}  // namespace
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

TEST(Registry, DeclaredSlotWithoutImplementationsIsUnavailable) {
  Registry r;
  r.declare(kMsdaSlot);
  EXPECT_EQ(r.active().at("ms_deform_attn"), kUnavailable);
  EXPECT_TRUE(r.iter_impls("ms_deform_attn").empty());
  add(r, kMsdaSlot, "hub", Impl(adds(1)));
  EXPECT_EQ(r.active().at("ms_deform_attn"), "hub");
}

}  // namespace
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

std::uint64_t calls_of(Registry& r, const std::string& slot, const std::string& impl) {
  for (const auto& s : r.report())
    if (s.slot == slot)
      for (const auto& c : s.candidates)
        if (c.name == impl) return c.calls;
  return ~std::uint64_t{0};
}

TEST(RegistryCallRecording, CountsThisThreadsCallsAndReplaysAddThem) {
  // A CUDA graph captures slot calls once and replays them without calling the slot: the
  // runner records the capture's calls and counts them again per replay.
  Registry r;
  add(r, kOp, kReference, Impl(adds(0)));
  add(r, kOp, "cuda", Impl(adds(100)), [] { return true; });
  add(r, kOther, kReference, Impl(adds(1)));
  EXPECT_EQ(run(r, kOp, 1), 101);  // before the recording: not recorded
  RecordedCalls recorded;
  {
    CallRecording recording;
    EXPECT_EQ(run(r, kOp, 1), 101);
    EXPECT_EQ(run(r, kOp, 2), 102);
    EXPECT_EQ(run(r, kOther, 2), 3);
    std::thread([&] { run(r, kOp, 3); }).join();  // another thread: not recorded
    {
      CallRecording inner;  // nested: the innermost records
      run(r, kOther, 0);
      EXPECT_EQ(inner.calls().total(), 1u);
    }
    recorded = recording.calls();
  }
  run(r, kOp, 4);  // after the recording: not recorded
  EXPECT_EQ(recorded.total(), 3u);
  EXPECT_EQ(recorded.of("op", "cuda"), 2u);
  EXPECT_EQ(recorded.of("other", kReference), 1u);
  EXPECT_EQ(recorded.of("op", kReference), 0u);
  EXPECT_EQ(calls_of(r, "op", "cuda"), 5u);
  r.count_replayed(recorded);
  r.count_replayed(recorded);
  EXPECT_EQ(calls_of(r, "op", "cuda"), 9u);
  EXPECT_EQ(calls_of(r, "other", kReference), 4u);
}

}  // namespace
}  // namespace libreyolo::kernels
