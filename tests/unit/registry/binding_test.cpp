// Handles (Registry::bind): what a model is bound to, per model, decided once at load.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "kernels/registry.h"
#include "log/log.h"

namespace libreyolo::kernels {
namespace {

using Impl = std::function<Outcome<int>(int)>;
constexpr SlotDef<int(int)> kOp{"op"};

Impl adds(int offset) {
  return [offset](int x) -> Outcome<int> { return x + offset; };
}

BindContext context(BindContext::Device device, const std::string& model) {
  BindContext c;
  c.device = device;
  c.model = model;
  return c;
}

/// A registry with op: reference (+0), cpu_fast (+10, any device), cuda (+100, CUDA models).
struct ThreeImpls : ::testing::Test {
  void SetUp() override {
    r.declare(kOp);
    r.register_impl(kOp, kReference, adds(0));
    r.register_impl(kOp, "cpu_fast", adds(10));
    r.register_impl(kOp, "cuda", adds(100), {}, cuda_models_only);
  }
  const BindingReport& binding_of(const std::vector<BindingReport>& all, const std::string& model) {
    for (const auto& b : all)
      if (b.model == model) return b;
    throw std::runtime_error("no binding for " + model);
  }
  Registry r;
};

TEST_F(ThreeImpls, CapabilityIsDecidedAtBindTime) {
  auto gpu = r.bind(kOp, context(BindContext::Device::cuda, "gpu_model"));
  auto cpu = r.bind(kOp, context(BindContext::Device::cpu, "cpu_model"));
  EXPECT_EQ(gpu(1), 101);
  EXPECT_EQ(cpu(1), 11);  // the cuda implementation is not even a candidate of a CPU model
  const auto all = r.bindings();
  const auto& c = binding_of(all, "cpu_model");
  EXPECT_EQ(c.selected, "cpu_fast");
  ASSERT_EQ(c.candidates.size(), 3u);
  EXPECT_EQ(c.candidates[0].name, "cpu_fast");
  EXPECT_EQ(c.candidates[1].name, kReference);
  EXPECT_EQ(c.candidates[2].name, "cuda");
  EXPECT_FALSE(c.candidates[2].eligible);
  EXPECT_EQ(c.candidates[2].reason, "the model is not on a CUDA device");
  EXPECT_EQ(binding_of(all, "gpu_model").selected, "cuda");
}

TEST_F(ThreeImpls, AModelsPolicyOverridesTheProcessListForItsSlots) {
  Filter process;  // automatic
  const Filter model = process.overridden({{"op", {"cpu_fast"}}});
  auto restricted = r.bind(kOp, context(BindContext::Device::cuda, "restricted"), &model);
  auto normal = r.bind(kOp, context(BindContext::Device::cuda, "normal"));
  EXPECT_EQ(restricted(1), 11);
  EXPECT_EQ(normal(1), 101);
  const auto all = r.bindings();
  const auto& b = binding_of(all, "restricted");
  EXPECT_EQ(b.selected, "cpu_fast");
  bool cuda_listed = false;
  for (const auto& c : b.candidates) {
    if (c.name != "cuda") continue;
    cuda_listed = true;
    EXPECT_FALSE(c.allowed);
    EXPECT_EQ(c.reason, "excluded by the model's policy");
  }
  EXPECT_TRUE(cuda_listed);
  // The process mode still wins: a model cannot re-allow what the process refused.
  Filter refs;
  refs.mode = Filter::Mode::reference_only;
  const Filter refs_model = refs.overridden({{"op", {"cuda"}}});
  EXPECT_EQ(r.bind(kOp, context(BindContext::Device::cuda, "m"), &refs_model)(1), 1);
}

TEST_F(ThreeImpls, CountersArePerBindingAndProcessWide) {
  auto a = r.bind(kOp, context(BindContext::Device::cpu, "a"));
  auto b = r.bind(kOp, context(BindContext::Device::cpu, "b"));
  for (int i = 0; i < 3; ++i) a(i);
  b(0);
  const auto all = r.bindings();
  EXPECT_EQ(binding_of(all, "a").candidates[0].calls, 3u);
  EXPECT_EQ(binding_of(all, "b").candidates[0].calls, 1u);
  for (const auto& s : r.report())
    for (const auto& c : s.candidates)
      if (c.name == "cpu_fast") EXPECT_EQ(c.calls, 4u);
}

TEST_F(ThreeImpls, AFailureInOneModelDisablesTheImplementationForEveryHandle) {
  log::Capture capture;
  Registry failing;
  failing.declare(kOp);
  failing.register_impl(kOp, kReference, adds(0));
  failing.register_impl(kOp, "flaky", [](int x) -> Outcome<int> {
    if (x == 7) throw std::runtime_error("device lost");
    return x + 1000;
  });
  auto a = failing.bind(kOp, context(BindContext::Device::cpu, "a"));
  auto b = failing.bind(kOp, context(BindContext::Device::cpu, "b"));
  EXPECT_EQ(b(1), 1001);
  EXPECT_EQ(a(7), 7);  // fell back to the reference
  EXPECT_EQ(b(1), 1);  // the other model's handle skips it from now on
  ASSERT_EQ(failing.events().size(), 1u);
  EXPECT_EQ(failing.events()[0].model, "a");
  EXPECT_EQ(failing.events()[0].reason, "device lost");
  EXPECT_EQ(capture.count(log::Level::warn,
                          "kernel op/flaky failed and is disabled for the rest of the process, "
                          "falling back (in model a): device lost"),
            1);
}

TEST_F(ThreeImpls, HandlesKeepTheirCandidatesAfterLaterRegistrations) {
  auto before = r.bind(kOp, context(BindContext::Device::cpu, "before"));
  r.register_impl(kOp, "late", adds(5));
  auto after = r.bind(kOp, context(BindContext::Device::cpu, "after"));
  EXPECT_EQ(before(1), 11);  // bound at load: a registration later does not change a model
  EXPECT_EQ(after(1), 6);
}

TEST_F(ThreeImpls, BindingsEndWithTheirHandles) {
  {
    auto h = r.bind(kOp, context(BindContext::Device::cpu, "gone"));
    EXPECT_EQ(r.bindings().size(), 1u);
  }
  EXPECT_TRUE(r.bindings().empty());
}

TEST(Binding, EmptyHandleRunsNothing) {
  Handle<int(int)> h;
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h(1), std::nullopt);
  Registry r;
  r.declare(kOp);
  auto bound = r.bind(kOp, BindContext{});  // declared, nothing registered
  EXPECT_TRUE(bound.empty());
  EXPECT_EQ(bound(1), std::nullopt);
}

TEST(Binding, AProviderWithAFailingCapabilityCheckIsNotLoaded) {
  class Unavailable : public Provider {
   public:
    std::string name() const override { return "cuda"; }
    const char* unavailable() const override { return "no usable CUDA device"; }
    void load(Registry&) override { ++loads; }
    int loads = 0;
  };
  Registry r;
  auto p = std::make_shared<Unavailable>();
  r.add_provider(p);
  r.resolve();
  EXPECT_EQ(p->loads, 0);
  ASSERT_EQ(r.providers().size(), 1u);
  EXPECT_EQ(r.providers()[0].state, "unavailable");
  EXPECT_EQ(r.providers()[0].detail, "no usable CUDA device");
  EXPECT_THROW(r.add_provider(std::make_shared<Unavailable>()), std::logic_error);
  EXPECT_EQ(r.known_names(), (std::set<std::string>{"cuda", kReference}));
}

}  // namespace
}  // namespace libreyolo::kernels
