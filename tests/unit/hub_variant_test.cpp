// Hub provider, pure logic: variant names, selection and preference order, compute-capability
// matching, kernels.lock parsing, cache paths (hf-kernels-hub.md sections 1.3-1.5, 2.2-2.3).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <fstream>

#include "hub_test_fs.h"
#include "kernels/hub/digest.h"
#include "kernels/hub/fetch.h"
#include "kernels/hub/lock.h"
#include "kernels/hub/metadata.h"
#include "kernels/hub/variant.h"
#include "kernels/policy.h"

namespace hub = libreyolo::kernels::hub;

namespace {

hub::SystemInfo cuda_12_8() {
  hub::SystemInfo s;
  s.torch_major = 2;
  s.torch_minor = 11;
  s.backend = "cuda";
  s.cuda_major = 12;
  s.cuda_minor = 8;
  return s;
}

std::string reason_of(const hub::Selection& s, const std::string& name) {
  for (const auto& [n, why] : s.rejected) {
    if (n == name) return why;
  }
  return "(accepted)";
}

}  // namespace

TEST(HubVariant, ParsesTheGrammar) {
  auto v = hub::parse_variant("torch213-cxx11-cu130-x86_64-linux");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->kind, hub::Variant::Kind::torch);
  EXPECT_EQ(v->major, 2);
  EXPECT_EQ(v->minor, 13);
  EXPECT_EQ(v->cxx11, std::optional<bool>(true));
  EXPECT_EQ(v->backend, "cuda");
  EXPECT_EQ(v->backend_major, 13);
  EXPECT_EQ(v->backend_minor, 0);
  EXPECT_EQ(v->cpu, "x86_64");
  EXPECT_EQ(v->os, "linux");

  v = hub::parse_variant("torch-stable-abi211-cu128-aarch64-linux");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->kind, hub::Variant::Kind::stable_abi);
  EXPECT_EQ(v->minor, 11);
  EXPECT_EQ(v->backend_major, 12);
  EXPECT_EQ(v->backend_minor, 8);
  EXPECT_EQ(v->cpu, "aarch64");

  v = hub::parse_variant("torch26-cxx98-cu118-x86_64-linux");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->minor, 6);
  EXPECT_EQ(v->cxx11, std::optional<bool>(false));
  EXPECT_EQ(v->backend_major, 11);
  EXPECT_EQ(v->backend_minor, 8);

  v = hub::parse_variant("torch210-cu128-x86_64-windows");
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->cxx11.has_value());
  EXPECT_EQ(v->os, "windows");

  EXPECT_EQ(hub::parse_variant("torch-universal")->kind, hub::Variant::Kind::universal);
  EXPECT_EQ(hub::parse_variant("torch-cuda")->kind, hub::Variant::Kind::noarch);
  EXPECT_EQ(hub::parse_variant("tvm-ffi01-cu128-x86_64-linux")->kind, hub::Variant::Kind::tvm_ffi);
  EXPECT_EQ(hub::parse_variant("rocm71-x86_64-linux"), std::nullopt);
  EXPECT_EQ(hub::parse_variant("torch211-cxx11-cuda-x86_64-linux"), std::nullopt);
}

// Fuzzing findings (docs/FUZZING.md; hub_lock_fuzz): a 100,000-character name overflowed the
// stack in std::regex, and version numbers beyond int threw std::out_of_range out of the parser.
TEST(HubVariant, HugeNamesAndNumbersAreNotVariants) {
  EXPECT_EQ(hub::parse_variant("torch211-cxx11-cpu-x86_64-" + std::string(100000, 'l')),
            std::nullopt);
  const std::string longest = "torch211-cxx11-cpu-x86_64-" + std::string(256 - 26, 'l');
  ASSERT_EQ(longest.size(), hub::kMaxVariantNameLength);
  EXPECT_EQ(hub::parse_variant(longest)->os, std::string(230, 'l'));
  EXPECT_EQ(hub::parse_variant(longest + "l"), std::nullopt);
  const std::string nines(30, '9');
  EXPECT_EQ(hub::parse_variant("torch2" + nines + "-cxx11-cpu-x86_64-linux"), std::nullopt);
  EXPECT_EQ(hub::parse_variant("torch-stable-abi2" + nines + "-cpu-x86_64-linux"), std::nullopt);
  EXPECT_EQ(hub::parse_variant("tvm-ffi1" + nines + "-cpu-x86_64-linux"), std::nullopt);
  EXPECT_EQ(hub::parse_variant("torch211-cxx11-cu" + nines + "-x86_64-linux"), std::nullopt);
}

// Fuzzing finding (hub_metadata_fuzz): a 20,000-character id overflowed the stack in std::regex
// under AddressSanitizer; it is checked without recursion, and a bad one is echoed clipped.
TEST(HubMetadata, HugeIdIsRefusedClipped) {
  const std::string id(100000, 'a');
  EXPECT_EQ(
      hub::parse_metadata("{\"id\": \"" + id + "\", \"backend\": {\"type\": \"cpu\"}}", "m.json")
          .id,
      id);
  try {
    hub::parse_metadata("{\"id\": \"" + id + "-\", \"backend\": {\"type\": \"cpu\"}}", "m.json");
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "m.json: id '" + std::string(48, 'a') +
                                         "...' (100001 characters) is not a valid op namespace");
  }
  EXPECT_EQ(hub::parse_metadata(
                R"({"id": "_ops_1", "backend": {"type": "cuda", "archs": ["9.0"]}})", "m.json")
                .archs,
            std::vector<std::string>{"9.0"});
  try {
    hub::parse_metadata(R"({"id": "9ops", "backend": {"type": "cpu"}})", "m.json");
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "m.json: id '9ops' is not a valid op namespace");
  }
  // Fuzzing finding (hub_metadata_fuzz's campaign, docs/FUZZING.md): JSON escapes put a tab and a
  // newline into the echoed id, a two-line error; control characters are written as \xNN.
  try {
    hub::parse_metadata(R"({"id": "_a\tb\nc", "backend": {"type": "cpu"}})", "m.json");
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "m.json: id '_a\\x09b\\x0ac' is not a valid op namespace");
  }
}

TEST(HubLock, ParseLockTextNamesTheFile) {
  const auto entries = hub::parse_lock_text(
      R"([{"repo_id": "o/r", "sha": "abc", "variants": {"v": {"files": {"a.so": "sha256:00"}}}}])",
      "x.lock");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].variants.at("v").files.at("a.so"), "00");
  try {
    hub::parse_lock_text("[7]", "x.lock");
    FAIL() << "accepted";
  } catch (const hub::LockError& e) {
    EXPECT_STREQ(e.what(), "x.lock: entry 0: must be an object");
  }
  // Fuzzing finding (hub_lock_fuzz's campaign, docs/FUZZING.md): a JSON-escaped newline in a
  // variant name made a two-line error; names are echoed with control characters as \xNN.
  try {
    hub::parse_lock_text(R"([{"repo_id": "o/r", "variants": {"v\nx": {}}}])", "x.lock");
    FAIL() << "accepted";
  } catch (const hub::LockError& e) {
    EXPECT_STREQ(e.what(),
                 "x.lock: entry 0: variant 'v\\x0ax': needs 'files' {path: sha256} or 'hash' "
                 "(kernels lock)");
  }
}

TEST(HubVariant, SelectionRulesAndUpstreamPreferenceOrder) {
  const std::vector<std::string> names = {"torch211-cxx11-cu126-x86_64-linux",
                                          "torch211-cxx11-cu128-x86_64-linux",
                                          "torch211-cxx11-cu130-x86_64-linux",
                                          "torch211-cu126-x86_64-linux",
                                          "torch210-cxx11-cu128-x86_64-linux",
                                          "torch211-cxx98-cu126-x86_64-linux",
                                          "torch-stable-abi29-cu126-x86_64-linux",
                                          "torch-stable-abi210-cu128-x86_64-linux",
                                          "torch-stable-abi212-cu128-x86_64-linux",
                                          "torch211-cxx11-cu128-aarch64-linux",
                                          "torch211-cxx11-cpu-x86_64-linux",
                                          "torch211-cxx11-rocm71-x86_64-linux",
                                          "torch-cuda",
                                          "torch-universal",
                                          "tvm-ffi01-cu128-x86_64-linux",
                                          "garbage"};
  const auto s = hub::select_variants(names, cuda_12_8());
  const std::vector<std::string> expected = {
      "torch-stable-abi210-cu128-x86_64-linux", "torch-stable-abi29-cu126-x86_64-linux",
      "torch211-cu126-x86_64-linux", "torch211-cxx11-cu128-x86_64-linux",
      "torch211-cxx11-cu126-x86_64-linux"};
  EXPECT_EQ(s.accepted, expected);
  EXPECT_EQ(s.rejected.size(), names.size() - expected.size());
  EXPECT_EQ(reason_of(s, "torch211-cxx11-cu130-x86_64-linux"),
            "CUDA 13.0: major != runtime CUDA 12.8");
  EXPECT_EQ(reason_of(s, "torch210-cxx11-cu128-x86_64-linux"), "Torch 2.10 != 2.11");
  EXPECT_EQ(reason_of(s, "torch211-cxx98-cu126-x86_64-linux"), "C++ ABI cxx98 != cxx11");
  EXPECT_EQ(reason_of(s, "torch-stable-abi212-cu128-x86_64-linux"),
            "stable ABI 2.12 needs Torch >= 2.12, runtime 2.11");
  EXPECT_EQ(reason_of(s, "torch211-cxx11-cu128-aarch64-linux"), "CPU aarch64 != x86_64");
  EXPECT_EQ(reason_of(s, "torch211-cxx11-cpu-x86_64-linux"), "backend cpu != cuda");
  EXPECT_EQ(reason_of(s, "torch211-cxx11-rocm71-x86_64-linux"), "backend rocm71 != cuda");
  EXPECT_EQ(reason_of(s, "torch-cuda"), "pure-Python variant: needs the Python runtime");
  EXPECT_EQ(reason_of(s, "tvm-ffi01-cu128-x86_64-linux"),
            "tvm-ffi variant: needs the tvm-ffi runtime");

  auto older = cuda_12_8();
  older.cuda_minor = 6;
  const auto s6 = hub::select_variants({"torch211-cxx11-cu128-x86_64-linux"}, older);
  EXPECT_TRUE(s6.accepted.empty());
  EXPECT_EQ(reason_of(s6, "torch211-cxx11-cu128-x86_64-linux"), "CUDA 12.8 > runtime CUDA 12.6");
}

TEST(HubVariant, ComputeCapabilityOfArchs) {
  EXPECT_TRUE(hub::arch_runs_on("9.0", 9, 0));
  EXPECT_TRUE(hub::arch_runs_on("8.0", 8, 6));  // SASS: same major, newer minor
  EXPECT_FALSE(hub::arch_runs_on("8.6", 8, 0));
  EXPECT_FALSE(hub::arch_runs_on("8.0", 9, 0));  // SASS never crosses a major
  EXPECT_TRUE(hub::arch_runs_on("8.0+PTX", 9, 0));
  EXPECT_FALSE(hub::arch_runs_on("10.0+PTX", 9, 0));
  EXPECT_TRUE(hub::arch_runs_on("9.0a", 9, 0));
  EXPECT_FALSE(hub::arch_runs_on("9.0a", 10, 0));
  EXPECT_TRUE(hub::arch_runs_on("10.0f", 10, 3));
  EXPECT_FALSE(hub::arch_runs_on("sm_90", 9, 0));
}

TEST(HubLock, RoundTripAndErrors) {
  const std::string dir = libreyolo::test::hubfs::temp_dir("hub_lock");
  const std::string path = dir + "/kernels.lock";
  hub::LockEntry e;
  e.repo_id = "kernels-community/deformable-detr";
  e.revision = "v1";
  e.sha = "0123456789abcdef0123456789abcdef01234567";
  e.variants["torch211-cxx11-cpu-x86_64-linux"].files["metadata.json"] = std::string(64, 'a');
  hub::write_lock_file(path, {e});
  const auto back = hub::read_lock_file(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].repo_id, e.repo_id);
  EXPECT_EQ(back[0].sha, e.sha);
  EXPECT_EQ(back[0].slot, "ms_deform_attn");
  EXPECT_EQ(back[0].variants.at("torch211-cxx11-cpu-x86_64-linux").files.at("metadata.json"),
            std::string(64, 'a'));

  std::ofstream(path)
      << R"([{"repo_id": "a/b", "sha": "x", "variants": {"v": {"files": {"../../etc/passwd": "00"}}}}])";
  try {
    hub::read_lock_file(path);
    FAIL() << "unsafe path accepted";
  } catch (const hub::LockError& err) {
    EXPECT_EQ(std::string(err.what()),
              path + ": entry 0: variant 'v': unsafe file name '../../etc/passwd'");
  }
  std::ofstream(path) << R"({"repo_id": "a/b"})";
  EXPECT_THROW(hub::read_lock_file(path), hub::LockError);
  libreyolo::test::hubfs::remove_tree(dir);

  EXPECT_TRUE(hub::is_commit(e.sha));
  EXPECT_FALSE(hub::is_commit("v1"));
  EXPECT_FALSE(hub::is_commit("0123456789ABCDEF0123456789abcdef01234567"));
}

TEST(HubLock, LockFileNextToTheConfigurationAndEnvironment) {
  libreyolo::kernels::HubSettings s;
  EXPECT_EQ(hub::lock_file_path(s), "");
  s.config_file = "/etc/libreyolo/server.yaml";
  EXPECT_EQ(hub::lock_file_path(s), "/etc/libreyolo/kernels.lock");
  s.lock_file.value = "/srv/pins.lock";
  EXPECT_EQ(hub::lock_file_path(s), "/srv/pins.lock");

  const auto p = libreyolo::kernels::policy_from_environment(
      {{"HF_TOKEN", "hf_secret"}, {"KERNELS_CACHE", "/cache/k"}, {"HF_HUB_OFFLINE", "1"}});
  EXPECT_EQ(p.hub.token, "hf_secret");
  EXPECT_TRUE(p.hub.offline.value);
  EXPECT_EQ(hub::connection_for(p.hub).cache_dir, "/cache/k");
  EXPECT_EQ(p.describe().find("hf_secret"), std::string::npos) << "the token must never be logged";
  EXPECT_EQ(hub::repo_cache_dir("/c", "kernels-community/deformable-detr"),
            "/c/kernels--kernels-community--deformable-detr");
  EXPECT_EQ(hub::variant_cache_dir("/c", "o/n", "abc", "torch211-cxx11-cpu-x86_64-linux"),
            "/c/kernels--o--n/snapshots/abc/build/torch211-cxx11-cpu-x86_64-linux");
}

TEST(HubDigest, KnownVectors) {
  EXPECT_EQ(hub::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string dir = libreyolo::test::hubfs::temp_dir("hub_digest");
  const std::string path = dir + "/abc";
  std::ofstream(path) << "abc";
  EXPECT_EQ(hub::sha256_hex_file(path), hub::sha256_hex("abc"));
  EXPECT_EQ(hub::digest_base64_file(path, "sha256"),
            "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=");
  EXPECT_THROW(hub::digest_base64_file(path, "md5"), std::runtime_error);
  ::unlink(path.c_str());
  EXPECT_THROW(hub::sha256_hex_file(path), std::runtime_error);
  libreyolo::test::hubfs::remove_tree(dir);
}
