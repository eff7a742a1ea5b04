// Kernel policy: environment parsing, YAML parsing with sources, errors with file and line.
#include "kernels/policy.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>

namespace libreyolo::kernels {
namespace {

Policy from_yaml(const std::string& text, const Environment& env = {}) {
  return parse_policy(YAML::Load(text)["kernels"], "server.yaml", env);
}

std::string error_of(const std::string& text) {
  try {
    from_yaml(text);
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Policy, Defaults) {
  Policy p = policy_from_environment({});
  EXPECT_EQ(p.selection.value, "auto");
  EXPECT_EQ(p.selection.source, Source::default_value);
  EXPECT_TRUE(p.hub_kernels.value);
  EXPECT_EQ(p.filter().mode, Filter::Mode::automatic);
  EXPECT_TRUE(p.filter().disabled_providers.empty());
}

TEST(Policy, OffAndReferenceSelectReferencesOnly) {
  for (const char* v : {"off", "reference", " OFF ", "Reference\t"}) {
    Policy p = policy_from_environment({{"LIBREYOLO_KERNELS", v}});
    EXPECT_EQ(p.filter().mode, Filter::Mode::reference_only) << v;
    EXPECT_EQ(p.selection.source, Source::environment);
    EXPECT_EQ(p.selection.origin, "LIBREYOLO_KERNELS");
    EXPECT_FALSE(p.filter().allows("ms_deform_attn", "cuda"));
    EXPECT_TRUE(p.filter().allows("ms_deform_attn", "reference"));
    EXPECT_FALSE(p.filter().allows_provider("cuda"));
    EXPECT_FALSE(p.filter().allows_provider("plugins"));
  }
}

TEST(Policy, OtherValuesRestrictToThatNamePlusReference) {
  Policy p = policy_from_environment({{"LIBREYOLO_KERNELS", "  CUDA "}});
  Filter f = p.filter();
  EXPECT_EQ(f.mode, Filter::Mode::only_name);
  EXPECT_EQ(f.name, "cuda");
  EXPECT_TRUE(f.allows("fake_quant_fp8", "cuda"));
  EXPECT_TRUE(f.allows("fake_quant_fp8", "reference"));
  EXPECT_FALSE(f.allows("fake_quant_fp8", "hub"));
  EXPECT_TRUE(f.allows_provider("cuda"));
}

TEST(Policy, LegacyAliasOnlyWhenPrimaryUnsetOrEmpty) {
  Policy a = policy_from_environment({{"LIBREYOLO_QUANT_KERNELS", "Reference"}});
  EXPECT_EQ(a.selection.value, "reference");
  EXPECT_EQ(a.selection.origin, "LIBREYOLO_QUANT_KERNELS");
  EXPECT_TRUE(a.selection_from_legacy_alias);

  Policy b =
      policy_from_environment({{"LIBREYOLO_KERNELS", "  "}, {"LIBREYOLO_QUANT_KERNELS", "off"}});
  EXPECT_EQ(b.selection.value, "off");

  Policy c =
      policy_from_environment({{"LIBREYOLO_KERNELS", "cuda"}, {"LIBREYOLO_QUANT_KERNELS", "off"}});
  EXPECT_EQ(c.selection.value, "cuda");
  EXPECT_EQ(c.selection.origin, "LIBREYOLO_KERNELS");
  EXPECT_FALSE(c.selection_from_legacy_alias);
}

TEST(Policy, HubKernelsEnvironmentFalsySet) {
  for (const char* v : {"0", "false", "off", "no", " NO ", "False", "OFF\n"}) {
    Policy p = policy_from_environment({{"LIBREYOLO_HUB_KERNELS", v}});
    EXPECT_FALSE(p.hub_kernels.value) << v;
    EXPECT_EQ(p.hub_kernels.source, Source::environment);
    EXPECT_EQ(p.filter().disabled_providers.count("hub"), 1u);
  }
  for (const char* v : {"1", "yes", "true", "", "on", " On "}) {
    Policy p = policy_from_environment({{"LIBREYOLO_HUB_KERNELS", v}});
    EXPECT_TRUE(p.hub_kernels.value) << v;
    EXPECT_TRUE(p.filter().allows_provider("hub"));
  }
}

TEST(Policy, EnvironmentValuesAreValidatedLikeTheYamlOnes) {
  auto env_error = [](const char* name, const char* value) -> std::string {
    try {
      policy_from_environment({{name, value}});
    } catch (const PolicyError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(env_error("LIBREYOLO_HUB_KERNELS", "nonsense"),
            "LIBREYOLO_HUB_KERNELS must be on or off (1/0, true/false, yes/no), got 'nonsense'");
  EXPECT_EQ(env_error("LIBREYOLO_LAYOUTS", "sometimes"),
            "LIBREYOLO_LAYOUTS must be default, on or off, got 'sometimes'");
  const Policy p = policy_from_environment({{"LIBREYOLO_LAYOUTS", "OFF"}});
  EXPECT_EQ(p.layouts.value, LayoutMode::off);
  EXPECT_EQ(p.layouts.origin, "LIBREYOLO_LAYOUTS");
  EXPECT_EQ(from_yaml("kernels: {layouts: on}").layouts.value, LayoutMode::on);
  EXPECT_EQ(from_yaml("kernels: {layouts: on}", {{"LIBREYOLO_LAYOUTS", "off"}}).layouts.value,
            LayoutMode::off);
  EXPECT_EQ(policy_from_environment({{"LIBREYOLO_KERNEL_PLUGINS", "/a.so:/b.so"}}).plugins.value,
            "/a.so:/b.so");
  // The hub cache's last fallback comes from the environment the policy is given, not getenv.
  EXPECT_EQ(policy_from_environment({{"HOME", "/home/u"}}).hub.fallback_cache_dir,
            "/home/u/.cache/huggingface/hub");
  EXPECT_EQ(
      policy_from_environment({{"HOME", "/home/u"}, {"HF_HOME", "/hf"}}).hub.fallback_cache_dir,
      "/hf/hub");
}

/// A registry declaring ms_deform_attn and fake_quant_fp8 with cuda and reference impls.
Registry& named_registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    constexpr SlotDef<int(int)> ms{"ms_deform_attn"}, fq{"fake_quant_fp8"};
    reg->declare(ms);
    reg->declare(fq);
    reg->register_impl(fq, kReference, [](int x) -> Outcome<int> { return x; });
    reg->register_impl(ms, "cuda", [](int x) -> Outcome<int> { return x; });
    reg->add_provider(make_provider("hub", [](Registry&) {}));
    return reg;
  }();
  return *r;
}

std::string names_error(const Policy& p) {
  try {
    check_names(p, named_registry());
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "";
}

TEST(Policy, NamesAreCheckedAgainstTheRegistry) {
  EXPECT_EQ(names_error(from_yaml("kernels:\n  slots:\n    ms_deform: {allow: [cuda]}\n")),
            "server.yaml:3:5: unknown slot 'ms_deform' in kernels.slots (declared: "
            "fake_quant_fp8, ms_deform_attn)");
  EXPECT_EQ(names_error(from_yaml("kernels:\n  slots:\n    ms_deform_attn: {allow: [cdua]}\n")),
            "server.yaml:3:5: kernels.slots.ms_deform_attn.allow: unknown implementation 'cdua' "
            "(known: cuda, hub, reference)");
  EXPECT_EQ(names_error(from_yaml("kernels:\n  selection: cdua\n")),
            "server.yaml:2:14: kernels.selection: unknown implementation 'cdua' (expected auto, "
            "off, reference or one of: cuda, hub, reference)");
  EXPECT_EQ(names_error(policy_from_environment({{"LIBREYOLO_KERNELS", "cdua"}})),
            "LIBREYOLO_KERNELS: kernels.selection: unknown implementation 'cdua' (expected auto, "
            "off, reference or one of: cuda, hub, reference)");
  // Known names pass, a provider's name counts before it loaded (hub), and so do off/reference.
  EXPECT_EQ(names_error(policy_from_environment({{"LIBREYOLO_KERNELS", "hub"}})), "");
  EXPECT_EQ(names_error(policy_from_environment({{"LIBREYOLO_KERNELS", "off"}})), "");
  EXPECT_EQ(names_error(from_yaml("kernels:\n  slots:\n    ms_deform_attn: {allow: [cuda]}\n")),
            "");
}

TEST(Policy, AModelsKernelSettings) {
  const auto node = YAML::Load("slots:\n  ms_deform_attn: {allow: [Reference]}\nlayouts: off\n");
  const auto m = parse_model_kernels(node, "serving.yaml");
  ASSERT_EQ(m.slot_allow.count("ms_deform_attn"), 1u);
  EXPECT_EQ(m.allow(), (SlotAllow{{"ms_deform_attn", {"reference"}}}));
  ASSERT_TRUE(m.layouts.has_value());
  EXPECT_EQ(m.layouts->value, LayoutMode::off);
  EXPECT_EQ(m.layouts->origin, "serving.yaml:3:10");
  try {
    parse_model_kernels(YAML::Load("selection: cuda\n"), "serving.yaml");
    FAIL();
  } catch (const PolicyError& e) {
    EXPECT_EQ(std::string(e.what()),
              "serving.yaml:1:1: unknown key kernels.selection (expected slots, layouts)");
  }
}

TEST(Policy, YamlHubKernelsOffAsBooleanAndAsString) {
  for (const char* text : {"kernels:\n  hub_kernels: off\n", "kernels:\n  hub_kernels: \"off\"\n",
                           "kernels:\n  hub_kernels: false\n"}) {
    Policy p = from_yaml(text);
    EXPECT_FALSE(p.hub_kernels.value) << text;
    EXPECT_EQ(p.hub_kernels.source, Source::file);
    EXPECT_EQ(p.hub_kernels.origin, "server.yaml:2:16");
  }
}

TEST(Policy, EnvironmentWinsOverYaml) {
  Policy p = from_yaml("kernels:\n  hub_kernels: off\n  selection: cuda\n",
                       {{"LIBREYOLO_HUB_KERNELS", "1"}, {"LIBREYOLO_KERNELS", "reference"}});
  EXPECT_TRUE(p.hub_kernels.value);
  EXPECT_EQ(p.hub_kernels.source, Source::environment);
  EXPECT_EQ(p.selection.value, "reference");
  EXPECT_EQ(p.selection.source, Source::environment);
  Policy q = from_yaml("kernels:\n  selection: cuda\n");
  EXPECT_EQ(q.selection.value, "cuda");
  EXPECT_EQ(q.selection.source, Source::file);
  EXPECT_EQ(q.selection.origin, "server.yaml:2:14");
}

TEST(Policy, SlotAllowList) {
  Policy p = from_yaml("kernels:\n  slots:\n    ms_deform_attn: {allow: [CUDA, hub]}\n");
  Filter f = p.filter();
  EXPECT_TRUE(f.allows("ms_deform_attn", "cuda"));
  EXPECT_TRUE(f.allows("ms_deform_attn", "hub"));
  EXPECT_FALSE(f.allows("ms_deform_attn", "plugin"));
  EXPECT_TRUE(f.allows("ms_deform_attn", "reference"));
  EXPECT_TRUE(f.allows("fake_quant_fp8", "plugin"));  // other slots unrestricted
}

TEST(Policy, FusedAttentionValues) {
  EXPECT_EQ(from_yaml("kernels: {fused_attention: on}").fused_attention.value, FusedAttention::on);
  EXPECT_EQ(from_yaml("kernels: {fused_attention: off}").fused_attention.value,
            FusedAttention::off);
  EXPECT_EQ(from_yaml("kernels: {fused_attention: default}").fused_attention.value,
            FusedAttention::family_default);
}

TEST(Policy, ErrorsNameFileLineAndColumn) {
  EXPECT_EQ(error_of("kernels:\n  selction: auto\n"),
            "server.yaml:2:3: unknown key kernels.selction (expected selection, hub_kernels, "
            "fused_attention, layouts, slots, hub)");
  EXPECT_EQ(error_of("kernels:\n  hub_kernels: maybe\n"),
            "server.yaml:2:16: kernels.hub_kernels must be a boolean (on/off, true/false), got "
            "'maybe'");
  EXPECT_EQ(error_of("kernels:\n  hub_kernels: [1]\n"),
            "server.yaml:2:16: kernels.hub_kernels must be a boolean (on/off, true/false)");
  EXPECT_EQ(error_of("kernels:\n  slots:\n    ms_deform_attn: {allow: cuda}\n"),
            "server.yaml:3:29: kernels.slots.ms_deform_attn.allow must be a list of names");
  EXPECT_EQ(error_of("kernels:\n  fused_attention: sometimes\n"),
            "server.yaml:2:20: kernels.fused_attention must be default, on or off");
  EXPECT_EQ(error_of("kernels:\n  hub:\n    endpont: x\n"),
            "server.yaml:3:5: unknown key kernels.hub.endpont (expected endpoint, cache_dir, "
            "offline, lock_file, timeout_seconds)");
  EXPECT_EQ(error_of("kernels: [1, 2]\n"), "server.yaml:1:10: kernels must be a mapping");
}

TEST(Policy, LoadFileReportsSyntaxErrorsAndMissingFiles) {
  const std::string path = ::testing::TempDir() + "/policy_syntax.yaml";
  {
    std::ofstream f(path);
    f << "kernels:\n  selection: [unclosed\n";
  }
  try {
    load_policy_file(path, {});
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":", 0), 0u) << e.what();
  }
  EXPECT_THROW(load_policy_file(path + ".missing", {}), PolicyError);
  {
    std::ofstream f(path);
    f << "server: {}\n";
  }
  EXPECT_EQ(load_policy_file(path, {}).selection.value, "auto");
  std::remove(path.c_str());
}

TEST(Policy, DescribeShowsSources) {
  Policy p = from_yaml("kernels:\n  hub_kernels: off\n", {{"LIBREYOLO_KERNELS", "reference"}});
  const std::string d = p.describe();
  EXPECT_NE(d.find("selection = reference  (environment: LIBREYOLO_KERNELS)"), std::string::npos)
      << d;
  EXPECT_NE(d.find("hub_kernels = off  (file: server.yaml:2:16)"), std::string::npos) << d;
  EXPECT_NE(d.find("fused_attention = default  (default)"), std::string::npos) << d;
}

}  // namespace
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

// Fuzzing finding (server_yaml_fuzz): yaml-cpp quotes the offending character of a parse error
// raw, so a configuration error could span lines or carry terminal control bytes.
TEST(Policy, ConfigurationErrorsAreOnePrintableLine) {
  EXPECT_EQ(printable(std::string("a\nb\x01\x7f\tc", 7)), "a\\x0ab\\x01\\x7f\\x09c");
  EXPECT_EQ(printable("kernels: {slots: {}}"), "kernels: {slots: {}}");
  const std::string file = std::string(::testing::TempDir()) + "/escape.yaml";
  std::ofstream(file) << "kernels:\n  selection: \"a\\\x01\"\n";
  try {
    load_policy_file(file, {});
    FAIL() << "accepted";
  } catch (const PolicyError& e) {
    EXPECT_EQ(std::string(e.what()), file + ":2:18: unknown escape character: \\x01");
  }
}

}  // namespace
}  // namespace libreyolo::kernels

namespace libreyolo::kernels {
namespace {

// server_yaml_fuzz found a slot name of raw 0xff bytes that --print-config wrote as a YAML key
// that did not read back (tests/fuzz/corpus/server_yaml/regress-slot-name-bytes.yaml).
TEST(Policy, SlotAndImplementationNamesArePrintableAscii) {
  EXPECT_EQ(error_of("kernels:\n  slots:\n    ms_deform_\xff\xff"
                     "attn:\n      allow: [cuda]\n"),
            "server.yaml:3:5: kernels.slots: slot name 'ms_deform_\xff\xff"
            "attn' must be 1 to "
            "128 printable ASCII characters without spaces");
  EXPECT_EQ(error_of("kernels:\n  slots:\n    ms_deform_attn:\n      allow: [\"cu da\"]\n"),
            "server.yaml:4:15: kernels.slots.ms_deform_attn.allow: name 'cu da' must be 1 to 128 "
            "printable ASCII characters without spaces");
}

}  // namespace
}  // namespace libreyolo::kernels
