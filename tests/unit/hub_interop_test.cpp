// huggingface/kernels interop of the `hub` provider (issue 34): the kernels.lock upstream's
// `kernels lock` writes (git_lfs_concat hashes, kernels/src/kernels/locking.py), the v<N> branch
// of a major version, the refusal of model-type repositories and LOCAL_KERNELS. Against the same
// loopback fake Hub (hub_test_server.h) and CMake-built artifacts (tests/hub/) as
// hub_provider_test.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hub_test_fs.h"
#include "hub_test_server.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/hub/digest.h"
#include "kernels/hub/fetch.h"
#include "kernels/hub/lock.h"
#include "kernels/hub/provider.h"
#include "kernels/policy.h"
#include "log/log.h"

#ifndef LIBREYOLO_HUB_TEST_REPOS
#define LIBREYOLO_HUB_TEST_REPOS LIBREYOLO_BINARY_DIR "/tests/hub/repos"
#endif

namespace fs = libreyolo::test::hubfs;
namespace hub = libreyolo::kernels::hub;
namespace lylog = libreyolo::log;
using libreyolo::kernels::BindContext;
using libreyolo::kernels::kMsDeformAttn;
using libreyolo::kernels::Registry;
using libreyolo::test::HubTestServer;

namespace {

constexpr const char* kSha = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kSha2 = "89abcdef0123456789abcdef0123456789abcdef";
constexpr const char* kLib = "_libreyolo_hubtest_cpu_ok.abi3.so";

std::string test_variant() {
#ifdef LIBREYOLO_HUB_TEST_VARIANT
  return LIBREYOLO_HUB_TEST_VARIANT;
#else
  const auto names = fs::list(std::string(LIBREYOLO_HUB_TEST_REPOS) + "/ok/build");
  return names.empty() ? "" : names[0];
#endif
}

std::string ok_variant_dir() {
  return std::string(LIBREYOLO_HUB_TEST_REPOS) + "/ok/build/" + test_variant();
}

hub::SystemInfo cpu_system() {
  auto s = hub::detect_system();
  s.backend = "cpu";
  s.cuda_major = s.cuda_minor = 0;
  s.compute_capability.reset();
  return s;
}

/// An independent git_lfs_concat (locking.py): (path, hash) pairs without *.pyc and
/// __pycache__/, sorted by path bytes; SHA-256 over path + unhex(hash) for each.
std::string reference_concat_hash(std::vector<std::pair<std::string, std::string>> files) {
  std::vector<std::pair<std::string, std::string>> kept;
  for (const auto& f : files) {
    const std::string& p = f.first;
    const bool pyc = p.size() >= 4 && p.substr(p.size() - 4) == ".pyc";
    const bool cache = ("/" + p + "/").find("/__pycache__/") != std::string::npos;
    if (!pyc && !cache) kept.push_back(f);
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return std::lexicographical_compare(
        a.first.begin(), a.first.end(), b.first.begin(), b.first.end(), [](char x, char y) {
          return static_cast<unsigned char>(x) < static_cast<unsigned char>(y);
        });
  });
  std::string bytes;
  for (const auto& [path, hash] : kept) {
    bytes += path;
    for (size_t i = 0; i < hash.size(); i += 2) {
      bytes += static_cast<char>(std::stoi(hash.substr(i, 2), nullptr, 16));
    }
  }
  return "sha256-" + hub::sha256_hex(bytes);
}

/// The upstream hash of a variant folder on disk: *.so files are LFS on the fake Hub (SHA-256),
/// every other file a plain git blob.
std::string upstream_hash_of(const std::string& variant_dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& f : fs::files_under(variant_dir)) {
    const std::string path = variant_dir + "/" + f;
    const bool lfs = f.size() > 3 && f.substr(f.size() - 3) == ".so";
    files.emplace_back(f,
                       lfs ? hub::sha256_hex_file(path) : hub::git_blob_sha1_hex(fs::read(path)));
  }
  return reference_concat_hash(files);
}

/// Small ms_deform_attn inputs (as hub_provider_test.cpp).
struct Inputs {
  libreyolo::kernels::SpatialShapes shapes{{{4, 6}}, {{2, 3}}};
  at::Tensor value, shapes_t, start_t, loc, attn;
  explicit Inputs(int seed) {
    at::manual_seed(seed);
    value = at::randn({2, 30, 2, 4});
    loc = at::rand({2, 5, 2, 2, 3, 2}) * 1.2 - 0.1;
    attn = at::softmax(at::randn({2, 5, 2, 6}), -1).view({2, 5, 2, 2, 3});
    shapes_t = libreyolo::kernels::spatial_shapes_tensor(shapes, at::kCPU);
    start_t = libreyolo::kernels::level_start_index(shapes, at::kCPU);
  }
  at::Tensor portable() const {
    return libreyolo::kernels::ms_deform_attn_portable(value, shapes, loc, attn);
  }
};

double hub_vs_portable(Registry& r) {
  Inputs in(4);
  BindContext c;
  auto out = r.bind(kMsDeformAttn, c)(in.value, in.shapes_t, in.start_t, in.loc, in.attn);
  return ((out ? *out : in.portable()) - in.portable()).abs().max().item<double>();
}

bool has_build(const hub::LoadedBuild& want) {
  for (const auto& b : hub::loaded_builds()) {
    if (b.slot == want.slot && b.repo_id == want.repo_id && b.source == want.source &&
        b.location == want.location && b.lock_format == want.lock_format)
      return true;
  }
  return false;
}

class HubInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_dir("hub_interop");
    ASSERT_FALSE(dir_.empty());
    settings.endpoint.value = server.endpoint();
    settings.cache_dir.value = dir_ + "/cache";
    settings.lock_file.value = dir_ + "/kernels.lock";
    settings.timeout_seconds.value = 5.0;
    settings.retries = 0;
  }
  void TearDown() override { fs::remove_tree(dir_); }

  /// A repository folder: the `ok` artifact plus a plain-git __init__.py and Python bytecode
  /// (which upstream leaves out of the hash and never downloads).
  std::string make_repo(const std::string& name) {
    const std::string root = dir_ + "/" + name;
    const std::string vdir = root + "/build/" + test_variant();
    fs::make_dirs(vdir + "/__pycache__");
    for (const auto& f : {std::string("metadata.json"), std::string(kLib)}) {
      fs::write(vdir + "/" + f, fs::read(ok_variant_dir() + "/" + f));
    }
    fs::write(vdir + "/__init__.py", "from ._ops import ops\n");
    fs::write(vdir + "/__pycache__/__init__.cpython-311.pyc", "bytecode");
    fs::write(vdir + "/stale.pyc", "bytecode");
    return root;
  }

  std::unique_ptr<Registry> make_registry(std::optional<std::string> local_kernels = "") {
    auto r = std::make_unique<Registry>();
    r->declare(kMsDeformAttn);
    hub::ProviderOptions o;
    o.settings = settings;
    o.system = cpu_system();
    o.capturing = [] { return false; };
    o.local_kernels = std::move(local_kernels);
    r->add_provider(hub::make_provider(std::move(o)));
    r->resolve();
    return r;
  }

  std::string tree_url(const std::string& repo, const std::string& sub,
                       const std::string& sha = kSha) const {
    return "GET /api/kernels/" + repo + "/tree/" + sha + "/" + sub + "?recursive=true";
  }
  std::string file_url(const std::string& repo, const std::string& file) const {
    return "GET /kernels/" + repo + "/resolve/" + kSha + "/build/" + test_variant() + "/" + file;
  }

  std::string dir_;
  HubTestServer server;
  libreyolo::kernels::HubSettings settings;
};

// A fixed vector, computed with Python's hashlib following locking.py get_kernel_locks exactly:
//   python3 -c 'import hashlib; b=lambda d: hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest();
//   f=[("metadata.json", b(b"{\"id\": \"_x\"}\n")), ("_x_1a2b.abi3.so",
//   hashlib.sha256(b"\x7fELF fake library").hexdigest()), ("__pycache__/ops.cpython-311.pyc",
//   "aa"*20), ("ops.pyc", "bb"*20), ("Zeta.py", b(b"")), ("sub/__init__.py", b(b"x = 1\n")),
//   ("na\u00efve.txt", b("é".encode()))]; m=hashlib.sha256();
//   [(m.update(p), m.update(bytes.fromhex(h))) for p, h in sorted((p.encode(), h) for p, h in f
//   if not (p.endswith(".pyc") or "__pycache__" in p.split("/")))]; print("sha256-"+m.hexdigest())'
TEST(HubInteropHash, GitLfsConcatMatchesPythonsHashlib) {
  EXPECT_EQ(hub::git_blob_sha1_hex("hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(hub::git_blob_sha1_hex(""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
  const std::vector<std::pair<std::string, std::string>> files = {
      {"metadata.json", hub::git_blob_sha1_hex("{\"id\": \"_x\"}\n")},
      {"_x_1a2b.abi3.so", hub::sha256_hex("\x7f"
                                          "ELF fake library")},
      {"__pycache__/ops.cpython-311.pyc", std::string(40, 'a')},
      {"ops.pyc", std::string(40, 'b')},
      {"Zeta.py", hub::git_blob_sha1_hex("")},
      {"sub/__init__.py", hub::git_blob_sha1_hex("x = 1\n")},
      {"na\xc3\xaf"
       "ve.txt",
       hub::git_blob_sha1_hex("\xc3\xa9")}};
  EXPECT_EQ(files[0].second, "a208399191cdf61df7252aa2d44cb10d3be47474");
  EXPECT_EQ(files[1].second, "78eabc4e9723e0bee66b91297c53105329ed5b00c9705e0ea64525df0f190c56");
  EXPECT_EQ(files[6].second, "4b04fff51468d8ab5201ab02b725dc477bc7cb45");
  const std::string expected =
      "sha256-0c0b3e65ec881b8330e642b958a3fe3cdf00d7d47cfe2b181d225f999db259f2";
  EXPECT_EQ(hub::git_lfs_concat_hash(files), expected);
  EXPECT_EQ(reference_concat_hash(files), expected);
  // Order of the input does not matter; bytecode does not count; any other file does.
  auto shuffled = files;
  std::reverse(shuffled.begin(), shuffled.end());
  shuffled.emplace_back("x/__pycache__/y.py", std::string(40, 'c'));
  EXPECT_EQ(hub::git_lfs_concat_hash(shuffled), expected);
  shuffled.emplace_back("__pycache__x.py", std::string(40, 'c'));  // not a __pycache__ folder
  EXPECT_NE(hub::git_lfs_concat_hash(shuffled), expected);
  EXPECT_TRUE(hub::excluded_from_variant_hash("a/__pycache__/b.py"));
  EXPECT_TRUE(hub::excluded_from_variant_hash("b.pyc"));
  EXPECT_FALSE(hub::excluded_from_variant_hash("__pycache__x.py"));
  EXPECT_FALSE(hub::excluded_from_variant_hash("b.pyi"));
  EXPECT_THROW(hub::git_lfs_concat_hash({{"a", "abc"}}), std::invalid_argument);
  EXPECT_THROW(hub::git_lfs_concat_hash({{"a", "zz"}}), std::invalid_argument);
}

TEST(HubInteropLock, UpstreamTextIsWhatPythonsJsonDumpWrites) {
  hub::LockEntry a;
  a.repo_id = "kernels-community/deformable-detr";
  a.revision = "v1";
  a.sha = "3f2c" + std::string(36, '0');
  a.variants["torch211-cxx11-cpu-x86_64-linux"].hash = "sha256-" + std::string(32 * 2, 'a');
  for (size_t i = 7; i < a.variants["torch211-cxx11-cpu-x86_64-linux"].hash.size(); i += 2)
    a.variants["torch211-cxx11-cpu-x86_64-linux"].hash[i + 1] = 'b';
  a.variants["torch211-cxx11-cu128-x86_64-linux"].hash = "sha256-" + std::string(64, 'c');
  for (size_t i = 7; i < a.variants["torch211-cxx11-cu128-x86_64-linux"].hash.size(); i += 2)
    a.variants["torch211-cxx11-cu128-x86_64-linux"].hash[i + 1] = 'd';
  hub::LockEntry b;
  b.repo_id = "org/empty";
  b.sha = std::string(40, 'f');
  // python3 -c 'import json; print(repr(json.dumps([{"repo_id":
  //   "kernels-community/deformable-detr", "sha": "3f2c"+"0"*36, "variants":
  //   {"torch211-cxx11-cpu-x86_64-linux": {"hash": "sha256-"+"ab"*32, "hash_type":
  //   "git_lfs_concat"}, "torch211-cxx11-cu128-x86_64-linux": {"hash": "sha256-"+"cd"*32,
  //   "hash_type": "git_lfs_concat"}}}, {"repo_id": "org/empty", "sha": "f"*40, "variants": {}}],
  //   indent=2)))'
  const std::string expected =
      "[\n  {\n    \"repo_id\": \"kernels-community/deformable-detr\",\n    \"sha\": "
      "\"3f2c000000000000000000000000000000000000\",\n    \"variants\": {\n      "
      "\"torch211-cxx11-cpu-x86_64-linux\": {\n        \"hash\": "
      "\"sha256-abababababababababababababababababababababababababababababababab\",\n        "
      "\"hash_type\": \"git_lfs_concat\"\n      },\n      \"torch211-cxx11-cu128-x86_64-linux\": "
      "{\n        \"hash\": "
      "\"sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd\",\n        "
      "\"hash_type\": \"git_lfs_concat\"\n      }\n    }\n  },\n  {\n    \"repo_id\": "
      "\"org/empty\",\n    \"sha\": \"ffffffffffffffffffffffffffffffffffffffff\",\n    "
      "\"variants\": {}\n  }\n]";
  EXPECT_EQ(hub::lock_text({a, b}, hub::LockFormat::upstream), expected);

  // Read back: upstream entries, the default slot, no revision.
  const auto back = hub::parse_lock_text(expected, "kernels.lock");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].format, hub::LockFormat::upstream);
  EXPECT_EQ(back[0].slot, "ms_deform_attn");
  EXPECT_EQ(back[0].sha, a.sha);
  EXPECT_EQ(back[0].revision, "");
  EXPECT_TRUE(back[0].variants.at("torch211-cxx11-cpu-x86_64-linux").upstream());
  EXPECT_EQ(back[0].variants.at("torch211-cxx11-cpu-x86_64-linux").hash,
            a.variants.at("torch211-cxx11-cpu-x86_64-linux").hash);
  EXPECT_TRUE(back[1].variants.empty());

  // A per-file (libreyolo) entry has no hash to write in the upstream format.
  hub::LockEntry files = a;
  files.variants.clear();
  files.variants["torch211-cxx11-cpu-x86_64-linux"].files["metadata.json"] = std::string(64, '0');
  try {
    hub::lock_text({files}, hub::LockFormat::upstream);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "kernels-community/deformable-detr variant torch211-cxx11-cpu-x86_64-linux has no "
              "git_lfs_concat hash: lock it again with --format upstream");
  }
  // The libreyolo format is unchanged (a version asked for is kept).
  files.version = 1;
  const auto ours = hub::parse_lock_text(hub::lock_text({files}), "kernels.lock");
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0].format, hub::LockFormat::libreyolo);
  EXPECT_EQ(ours[0].version, std::optional<int>(1));
  EXPECT_EQ(ours[0].revision, "v1");
  EXPECT_FALSE(ours[0].variants.at("torch211-cxx11-cpu-x86_64-linux").upstream());
}

TEST(HubInteropLock, MalformedUpstreamEntriesAreRefusedWithExactMessages) {
  auto error = [](const std::string& text) {
    try {
      hub::parse_lock_text(text, "k.lock");
    } catch (const hub::LockError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = R"([{"repo_id": "a/b", "sha": ")" + std::string(40, '1') +
                           R"(", "variants": {"torch211-cxx11-cpu-x86_64-linux": )";
  EXPECT_EQ(error(head + R"({"hash": "sha256-xyz"}}}])"),
            "k.lock: entry 0: variant 'torch211-cxx11-cpu-x86_64-linux': 'hash' must be "
            "\"sha256-<64 hex>\"");
  EXPECT_EQ(
      error(head + R"({"hash": "sha256-)" + std::string(64, 'a') + R"(", "hash_type": "sha1"}}}])"),
      "k.lock: entry 0: variant 'torch211-cxx11-cpu-x86_64-linux': unknown 'hash_type' "
      "\"sha1\" (only \"git_lfs_concat\")");
  EXPECT_EQ(error(head + R"({}}}])"),
            "k.lock: entry 0: variant 'torch211-cxx11-cpu-x86_64-linux': needs 'files' {path: "
            "sha256} or 'hash' (kernels lock)");
  EXPECT_EQ(error(R"([{"repo_id": "a/b", "version": "1"}])"),
            "k.lock: entry 0: 'version' must be an integer major version (0 to 1000000)");
  // hash_type may be left out (VariantLock's default).
  EXPECT_EQ(error(head + R"({"hash": "sha256-)" + std::string(64, 'a') + R"("}}}])"), "no error");
}

TEST(HubInteropLocal, ParsesLocalKernelsLikeUpstream) {
  EXPECT_TRUE(hub::parse_local_kernels("").empty());
  const auto m = hub::parse_local_kernels("a/b=/x:c/d=/y=z:a/b=/w");
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"a/b", "/w"}, {"c/d", "/y=z"}}));
  auto error = [](const std::string& value) {
    try {
      hub::parse_local_kernels(value);
    } catch (const hub::LocalKernelsError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("a/b=/x:c/d"),
            "Invalid LOCAL_KERNELS entry: c/d. Expected format: repo_id_1=path_1:repo_id_2=path_2");
  EXPECT_EQ(error("ab=/x"), "Invalid LOCAL_KERNELS entry: ab=/x. 'ab' is not <org>/<name>");
  EXPECT_EQ(error("a/b="), "Invalid LOCAL_KERNELS entry: a/b=. The path is empty");
  EXPECT_EQ(error("a/b=/x:"),
            "Invalid LOCAL_KERNELS entry: . Expected format: repo_id_1=path_1:repo_id_2=path_2");
}

// kernels lock --format upstream --version 1: the v1 branch from the refs list, the hash from
// the tree listing alone (no download), byte-compatible with locking.py; then the daemon loads
// the build from that lock, verifying the listing against the hash and every file against the
// listing; bytecode is neither hashed nor downloaded; offline, the cache's blob names are enough.
TEST_F(HubInterop, UpstreamLockLoadsVerifiedOnlineAndOffline) {
  const std::string root = make_repo("up");
  server.add_repo("libreyolo-test/up", root, kSha, {"main"});
  server.set_branch("libreyolo-test/up", "v1", kSha);
  server.set_branch("libreyolo-test/up", "v2", kSha2);
  auto c = hub::connection_for(settings);
  lylog::Capture capture;
  const auto entry = hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/up", "", {},
                                    hub::LockFormat::upstream, 1);
  EXPECT_EQ(server.requests(), (std::vector<std::string>{"GET /api/kernels/libreyolo-test/up/refs",
                                                         tree_url("libreyolo-test/up", "build")}));
  EXPECT_EQ(capture.count(lylog::Level::warn,
                          "hub: You are using version 1 of 'libreyolo-test/up', but version 2 is "
                          "available."),
            1);
  EXPECT_EQ(entry.sha, kSha);
  EXPECT_EQ(entry.revision, "v1");
  const std::string hash = upstream_hash_of(root + "/build/" + test_variant());
  ASSERT_EQ(entry.variants.size(), 1u);
  EXPECT_EQ(entry.variants.at(test_variant()).hash, hash);
  EXPECT_TRUE(entry.variants.at(test_variant()).upstream());
  hub::write_lock_file(settings.lock_file.value, {entry}, hub::LockFormat::upstream);
  EXPECT_EQ(fs::read(settings.lock_file.value),
            "[\n  {\n    \"repo_id\": \"libreyolo-test/up\",\n    \"sha\": \"" + std::string(kSha) +
                "\",\n    \"variants\": {\n      \"" + test_variant() +
                "\": {\n        \"hash\": \"" + hash +
                "\",\n        \"hash_type\": \"git_lfs_concat\"\n      }\n    }\n  }\n]");

  server.clear();
  auto r = make_registry();
  EXPECT_TRUE(r->events().empty()) << r->events()[0].reason;
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  EXPECT_EQ(server.requests(),
            (std::vector<std::string>{tree_url("libreyolo-test/up", "build/" + test_variant()),
                                      file_url("libreyolo-test/up", "metadata.json"),
                                      file_url("libreyolo-test/up", "__init__.py"),
                                      file_url("libreyolo-test/up", kLib)}));
  EXPECT_LT(hub_vs_portable(*r), 1e-5);
  EXPECT_TRUE(has_build({"ms_deform_attn", "libreyolo-test/up", "hub",
                         "libreyolo-test/up@" + std::string(kSha) + " build/" + test_variant(),
                         "upstream"}));
  // huggingface_hub's blob names: the git blob id for plain files, the SHA-256 for LFS ones.
  const std::string snap =
      hub::variant_cache_dir(settings.cache_dir.value, "libreyolo-test/up", kSha, test_variant());
  EXPECT_EQ(fs::read_link(snap + "/metadata.json"),
            "../../../../blobs/" + hub::git_blob_sha1_hex(fs::read(snap + "/metadata.json")));
  EXPECT_EQ(fs::read_link(snap + "/" + kLib),
            "../../../../blobs/" + hub::sha256_hex_file(snap + "/" + kLib));

  // Offline: no request; the cached files are checked through their blob names.
  server.clear();
  settings.offline.value = true;
  auto offline = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_TRUE(offline->events().empty()) << offline->events()[0].reason;
  EXPECT_EQ(offline->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));

  // A cached file altered offline is refused.
  const std::string init = snap + "/__init__.py";
  ::unlink(init.c_str());
  ASSERT_EQ(::symlink(("../../../../blobs/" + std::string(40, 'a')).c_str(), init.c_str()), 0);
  fs::write(hub::repo_cache_dir(settings.cache_dir.value, "libreyolo-test/up") + "/blobs/" +
                std::string(40, 'a'),
            "tampered\n");
  auto tampered = make_registry();
  ASSERT_EQ(tampered->events().size(), 1u);
  EXPECT_EQ(tampered->events()[0].reason, "digest: cached " + init + " has git blob id " +
                                              hub::git_blob_sha1_hex("tampered\n") +
                                              ", its blob name says " + std::string(40, 'a'));
  EXPECT_EQ(tampered->resolve(kMsDeformAttn.name), std::nullopt);
}

TEST_F(HubInterop, UpstreamHashMismatchIsRefusedBeforeAnyDownload) {
  const std::string root = make_repo("up");
  server.add_repo("libreyolo-test/up", root, kSha);
  const std::string good = upstream_hash_of(root + "/build/" + test_variant());
  const std::string wrong = "sha256-" + std::string(64, '0');
  fs::write(settings.lock_file.value, R"([{"repo_id": "libreyolo-test/up", "sha": ")" +
                                          std::string(kSha) + R"(", "variants": {")" +
                                          test_variant() + R"(": {"hash": ")" + wrong +
                                          R"(", "hash_type": "git_lfs_concat"}}}])");
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_EQ(server.requests(),
            std::vector<std::string>{tree_url("libreyolo-test/up", "build/" + test_variant())});
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason, "digest: build/" + test_variant() + " of libreyolo-test/up@" +
                                       kSha + ": the Hub's file list hashes to " + good +
                                       ", kernels.lock says " + wrong + " (git_lfs_concat)");
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);

  // More bytecode on the Hub does not change the hash: the right one still loads.
  fs::write(root + "/build/" + test_variant() + "/__pycache__/more.cpython-312.pyc", "x");
  EXPECT_EQ(upstream_hash_of(root + "/build/" + test_variant()), good);
  fs::write(settings.lock_file.value, R"([{"repo_id": "libreyolo-test/up", "sha": ")" +
                                          std::string(kSha) + R"(", "variants": {")" +
                                          test_variant() + R"(": {"hash": ")" + good + R"("}}}])");
  auto ok = make_registry();
  EXPECT_TRUE(ok->events().empty()) << ok->events()[0].reason;
  EXPECT_EQ(ok->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  for (const auto& req : server.requests()) EXPECT_EQ(req.find(".pyc"), std::string::npos) << req;
}

// The listing and the lock agree, the download does not: a plain git file is checked against
// its blob id, an LFS file against its SHA-256.
TEST_F(HubInterop, DownloadedContentIsCheckedAgainstTheListedBlobIdOrLfsSha256) {
  const std::string root = make_repo("up");
  server.add_repo("libreyolo-test/up", root, kSha);
  auto c = hub::connection_for(settings);
  auto entry =
      hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/up", "v1", {}, hub::LockFormat::upstream);
  hub::write_lock_file(settings.lock_file.value, {entry}, hub::LockFormat::upstream);
  const std::string vdir = root + "/build/" + test_variant();

  server.corrupt("libreyolo-test/up", "build/" + test_variant() + "/__init__.py", "evil = 1\n");
  auto r = make_registry();
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason, "digest: downloaded build/" + test_variant() +
                                       "/__init__.py of libreyolo-test/up@" + kSha +
                                       " has git blob id " + hub::git_blob_sha1_hex("evil = 1\n") +
                                       ", the Hub's tree lists " +
                                       hub::git_blob_sha1_hex(fs::read(vdir + "/__init__.py")));

  server.corrupt("libreyolo-test/up", "build/" + test_variant() + "/__init__.py",
                 fs::read(vdir + "/__init__.py"));
  server.corrupt("libreyolo-test/up", "build/" + test_variant() + "/" + kLib, "not the library");
  auto lfs = make_registry();
  ASSERT_EQ(lfs->events().size(), 1u);
  EXPECT_EQ(lfs->events()[0].reason,
            "digest: downloaded build/" + test_variant() + "/" + kLib + " of libreyolo-test/up@" +
                kSha + " has sha256 " + hub::sha256_hex("not the library") +
                ", the Hub's tree lists " + hub::sha256_hex_file(vdir + "/" + kLib));
  EXPECT_EQ(lfs->resolve(kMsDeformAttn.name), std::nullopt);
}

TEST_F(HubInterop, MajorVersionResolvesToItsBranchOrSaysWhatExists) {
  server.add_repo("libreyolo-test/up", make_repo("up"), kSha, {});
  server.set_branch("libreyolo-test/up", "v1", kSha);
  server.set_branch("libreyolo-test/up", "v2", kSha2);
  server.set_branch("libreyolo-test/up", "vnext", kSha2);  // not a version: ignored
  auto c = hub::connection_for(settings);
  const auto v2 = hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/up", "", {},
                                 hub::LockFormat::libreyolo, 2);
  EXPECT_EQ(v2.sha, kSha2);
  EXPECT_EQ(v2.revision, "v2");
  EXPECT_EQ(v2.version, std::optional<int>(2));
  std::ifstream ref(hub::repo_cache_dir(settings.cache_dir.value, "libreyolo-test/up") +
                    "/refs/v2");
  std::string ref_sha;
  ref >> ref_sha;
  EXPECT_EQ(ref_sha, kSha2);
  try {
    hub::resolve_version(c, "libreyolo-test/up", 3);
    FAIL() << "no error";
  } catch (const hub::HubError& e) {
    EXPECT_EQ(std::string(e.what()),
              "resolve: libreyolo-test/up: Version 3 not found, available versions: 1, 2");
  }
  // Offline: the cache's refs/v<N> (written by the lock above), no request.
  server.clear();
  settings.offline.value = true;
  auto off = hub::connection_for(settings);
  EXPECT_EQ(hub::resolve_version(off, "libreyolo-test/up", 2), kSha2);
  try {
    hub::resolve_version(off, "libreyolo-test/up", 1);
    FAIL() << "no error";
  } catch (const hub::HubError& e) {
    EXPECT_EQ(e.category, "offline");
  }
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(HubInterop, ModelTypeRepositoryIsRefused) {
  server.add_model_repo("libreyolo-test/model", make_repo("model"), kSha);
  auto c = hub::connection_for(settings);
  const std::string message =
      "model_repo: libreyolo-test/model is a model-type repository on " + server.endpoint() +
      "; only kernel-type repositories load (as huggingface/kernels since 0.14): publish it as a "
      "kernel repository (kernel-builder build-and-upload --repo-type kernel)";
  try {
    hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/model", "", {}, hub::LockFormat::upstream,
                   1);
    FAIL() << "no error";
  } catch (const hub::HubError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
  EXPECT_EQ(server.requests(),
            (std::vector<std::string>{"GET /api/kernels/libreyolo-test/model/refs",
                                      "GET /api/models/libreyolo-test/model"}));

  // At start-up, from a lock of either format: the first request tells, nothing is loaded.
  hub::LockEntry ours;
  ours.repo_id = "libreyolo-test/model";
  ours.sha = kSha;
  ours.variants[test_variant()].files["metadata.json"] = std::string(64, '0');
  hub::LockEntry theirs = ours;
  theirs.variants[test_variant()].files.clear();
  theirs.variants[test_variant()].hash = "sha256-" + std::string(64, '0');
  for (const auto& [entry, format] : {std::make_pair(ours, hub::LockFormat::libreyolo),
                                      std::make_pair(theirs, hub::LockFormat::upstream)}) {
    hub::write_lock_file(settings.lock_file.value, {entry}, format);
    auto r = make_registry();
    ASSERT_EQ(r->events().size(), 1u);
    EXPECT_EQ(r->events()[0].reason, message);
    EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
  }

  // A repository that does not exist at all is not called a model repository.
  try {
    hub::resolve_revision(c, "libreyolo-test/missing", "v1");
    FAIL() << "no error";
  } catch (const hub::HubError& e) {
    EXPECT_EQ(e.category, "resolve");
  }
}

// LOCAL_KERNELS overrides the locked repository with a local build folder: no request, the
// metadata.json digest checked, logged and listed as local. Both folder forms of load.py
// get_local_kernel: the repository root (build/<variant>/ inside) and the variant folder.
TEST_F(HubInterop, LocalKernelsLoadsTheLocalBuildVerified) {
  const std::string root = dir_ + "/devel/ok";
  const std::string vdir = root + "/build/" + test_variant();
  fs::make_dirs(vdir);
  fs::write(vdir + "/" + kLib, fs::read(ok_variant_dir() + "/" + kLib));
  auto write_meta = [&](const std::string& b64) {
    nlohmann::json m = nlohmann::json::parse(fs::read(ok_variant_dir() + "/metadata.json"));
    m["digest"] = {{"algorithm", "sha256"}, {"files", {{kLib, b64}}}};
    fs::write(vdir + "/metadata.json", m.dump());
  };
  write_meta(hub::digest_base64_file(vdir + "/" + kLib, "sha256"));
  // The lock pins the Hub build (which the fake Hub does not even serve).
  hub::LockEntry entry;
  entry.repo_id = "libreyolo-test/ok";
  entry.sha = kSha;
  entry.variants[test_variant()].hash = "sha256-" + std::string(64, '0');
  hub::write_lock_file(settings.lock_file.value, {entry}, hub::LockFormat::upstream);

  for (const std::string& path : {root, vdir}) {
    lylog::Capture capture;
    auto r = make_registry("other/unused=/nowhere:libreyolo-test/ok=" + path);
    EXPECT_TRUE(server.requests().empty());
    EXPECT_TRUE(r->events().empty()) << r->events()[0].reason;
    EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
    EXPECT_EQ(capture.count(lylog::Level::info,
                            "hub: libreyolo-test/ok is overridden by "
                            "LOCAL_KERNELS: local build " +
                                vdir + " (not pinned by " + settings.lock_file.value + ")"),
              1);
    EXPECT_EQ(capture.count(lylog::Level::warn, "hub: LOCAL_KERNELS names other/unused, which " +
                                                    settings.lock_file.value +
                                                    " does not list: not loaded"),
              1);
    EXPECT_LT(hub_vs_portable(*r), 1e-5);
  }
  EXPECT_TRUE(has_build({"ms_deform_attn", "libreyolo-test/ok", "local", vdir, ""}));

  // A library that does not match metadata.json's digest is refused; the slot falls back.
  write_meta("AAAA");
  auto bad = make_registry("libreyolo-test/ok=" + root);
  ASSERT_EQ(bad->events().size(), 1u);
  EXPECT_EQ(bad->events()[0].reason, "digest: LOCAL_KERNELS libreyolo-test/ok build " + vdir +
                                         ": metadata.json digest mismatch for " + kLib + ": " +
                                         hub::digest_base64_file(vdir + "/" + kLib, "sha256") +
                                         " != AAAA");
  EXPECT_EQ(bad->resolve(kMsDeformAttn.name), std::nullopt);

  // A folder without any build.
  auto empty = make_registry("libreyolo-test/ok=" + dir_ + "/nothing");
  ASSERT_EQ(empty->events().size(), 1u);
  EXPECT_EQ(empty->events()[0].reason.rfind("local: LOCAL_KERNELS libreyolo-test/ok=" + dir_ +
                                                "/nothing: no kernel build for this process",
                                            0),
            0u)
      << empty->events()[0].reason;

  // A malformed value loads nothing at all (neither the override nor the Hub build).
  lylog::Capture capture;
  auto malformed = make_registry("libreyolo-test/ok");
  EXPECT_TRUE(server.requests().empty());
  ASSERT_EQ(malformed->events().size(), 1u);
  EXPECT_EQ(malformed->events()[0].reason,
            "local: Invalid LOCAL_KERNELS entry: libreyolo-test/ok. Expected format: "
            "repo_id_1=path_1:repo_id_2=path_2");
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
}

// The command line: `kernels lock --format upstream --version 1` writes what lock_repo computes,
// in upstream's text; a bad --format is a usage error.
TEST_F(HubInterop, LockCommandWritesTheUpstreamFormat) {
  const std::string tool = std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-kernels-hub";
  if (!fs::exists(tool)) GTEST_SKIP() << tool << " is not built";
  server.add_repo("libreyolo-test/up", make_repo("up"), kSha);
  const std::string lock = dir_ + "/cli.lock", out = dir_ + "/out.txt";
  const std::string env =
      "env -u HF_HUB_OFFLINE -u HF_TOKEN -u LOCAL_KERNELS HF_ENDPOINT=" + server.endpoint() +
      " KERNELS_CACHE=" + dir_ + "/cli-cache ";
  const int rc =
      std::system((env + tool + " lock --lock-file " + lock +
                   " --repo libreyolo-test/up --version 1 --format upstream > " + out + " 2>&1")
                      .c_str());
  ASSERT_EQ(rc, 0) << fs::read(out);
  EXPECT_EQ(fs::read(out), "locked libreyolo-test/up v1 -> " + std::string(kSha) +
                               " (1 variants, upstream format) in " + lock + "\n");
  auto c = hub::connection_for(settings);
  const auto entry = hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/up", "", {},
                                    hub::LockFormat::upstream, 1);
  EXPECT_EQ(fs::read(lock), hub::lock_text({entry}, hub::LockFormat::upstream));
  const auto back = hub::read_lock_file(lock);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].variants.at(test_variant()).hash,
            upstream_hash_of(dir_ + "/up/build/" + test_variant()));

  const int bad = std::system((tool + " lock --format toml > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(bad), 2);
  EXPECT_EQ(fs::read(out).rfind("error: --format is libreyolo or upstream, got 'toml'\n", 0), 0u)
      << fs::read(out);
}

// A lock entry that asks for a major version and no commit is refused at start-up as unpinned;
// `kernels lock --update` pins it to the v<N> branch's commit, then it loads.
TEST_F(HubInterop, LockUpdatePinsAnEntryThatAsksForAVersion) {
  const std::string tool = std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-kernels-hub";
  if (!fs::exists(tool)) GTEST_SKIP() << tool << " is not built";
  server.add_repo("libreyolo-test/up", make_repo("up"), kSha2, {"main"});
  server.set_branch("libreyolo-test/up", "v1", kSha);
  const std::string& lock = settings.lock_file.value;
  fs::write(lock, R"([{"repo_id": "libreyolo-test/up", "version": 1}])");
  auto unpinned = make_registry();
  ASSERT_EQ(unpinned->events().size(), 1u);
  EXPECT_EQ(unpinned->events()[0].reason,
            "unpinned: libreyolo-test/up in " + lock +
                " is not pinned: sha '' is not a 40-hex commit (revision 'v1'); pin it with "
                "`libreyolo-server kernels lock`");

  const std::string out = dir_ + "/out.txt";
  const std::string cmd =
      "env -u HF_HUB_OFFLINE -u HF_TOKEN -u LOCAL_KERNELS HF_ENDPOINT=" + server.endpoint() +
      " KERNELS_CACHE=" + dir_ + "/cli-cache " + tool + " lock --update --lock-file " + lock;
  ASSERT_EQ(std::system((cmd + " > " + out + " 2>&1").c_str()), 0) << fs::read(out);
  EXPECT_EQ(fs::read(out), "locked libreyolo-test/up v1 -> " + std::string(kSha) +
                               " (1 variants, libreyolo format)\nupdated 1 entries in " + lock +
                               "\n");
  const auto pinned = hub::read_lock_file(lock);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_EQ(pinned[0].sha, kSha);
  EXPECT_EQ(pinned[0].version, std::optional<int>(1));
  EXPECT_EQ(pinned[0].variants.at(test_variant()).files.size(), 3u);  // bytecode not locked
  auto r = make_registry();
  EXPECT_TRUE(r->events().empty()) << r->events()[0].reason;
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));

  // An upstream-format entry records only its commit: nothing to update it to.
  auto upstream = pinned[0];
  upstream.version.reset();
  upstream.revision.clear();
  upstream.variants.at(test_variant()).files.clear();
  upstream.variants.at(test_variant()).hash = "sha256-" + std::string(64, '0');
  hub::write_lock_file(lock, {upstream}, hub::LockFormat::upstream);
  EXPECT_EQ(WEXITSTATUS(std::system((cmd + " --format upstream > " + out + " 2>&1").c_str())), 1);
  EXPECT_EQ(fs::read(out), "error: libreyolo-test/up in " + lock +
                               " asks for no version or revision: lock it with --repo "
                               "libreyolo-test/up --version N\n");
}

}  // namespace
