// The `hub` provider end to end on CPU: artifacts in the kernels-hub layout built by CMake
// (tests/hub/), served by a loopback server with the Hub's URL scheme (hub_test_server.h),
// fetched into a temporary HF-layout cache, verified, dlopen()ed and called through the
// registry. Every case counts the server's requests and the warnings.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#if __has_include(<ATen/cuda/CUDAGraph.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#define HUB_TEST_CUDA_GRAPHS 1
#endif
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
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
using libreyolo::kernels::MsDeformAttnImpl;
using libreyolo::kernels::Registry;
using libreyolo::test::HubTestServer;

namespace {

constexpr const char* kSha = "0123456789abcdef0123456789abcdef01234567";

std::string test_variant() {
#ifdef LIBREYOLO_HUB_TEST_VARIANT
  return LIBREYOLO_HUB_TEST_VARIANT;
#else
  const auto names = fs::list(std::string(LIBREYOLO_HUB_TEST_REPOS) + "/ok/build");
  return names.empty() ? "" : names[0];
#endif
}

std::string repo_of(const std::string& kind) {
  return std::string(LIBREYOLO_HUB_TEST_REPOS) + "/" + kind;
}

/// The CPU process facts (the GPU machine runs these tests too: the artifacts are CPU builds).
hub::SystemInfo cpu_system() {
  auto s = hub::detect_system();
  s.backend = "cpu";
  s.cuda_major = s.cuda_minor = 0;
  s.compute_capability.reset();
  return s;
}

/// kernels.lock entry computed from the artifact on disk (what `kernels lock` records).
hub::LockEntry local_lock(const std::string& root, const std::string& repo_id) {
  hub::LockEntry e;
  e.repo_id = repo_id;
  e.revision = "v1";
  e.sha = kSha;
  for (const auto& v : fs::list(root + "/build")) {
    const std::string vdir = root + "/build/" + v;
    for (const auto& f : fs::files_under(vdir)) {
      e.variants[v].files[f] = hub::sha256_hex_file(vdir + "/" + f);
    }
  }
  return e;
}

/// Small ms_deform_attn inputs: B=2, S=4*6+2*3, heads 2, C=4, Q=5, L=2, P=3; locations in
/// [-0.1, 1.1] so that some samples fall outside the maps (zeros).
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

/// What the slot entry point does with a registry: its implementations, then the portable path.
at::Tensor slot_call(Registry& r, const Inputs& in) {
  BindContext c;
  c.device = in.value.is_cuda() ? BindContext::Device::cuda : BindContext::Device::cpu;
  auto out = r.bind(kMsDeformAttn, c)(in.value, in.shapes_t, in.start_t, in.loc, in.attn);
  return out ? *out : in.portable();
}

/// Restarts the call counter of a loaded test library (its op `<ns>::reset_calls`).
void reset_test_op_calls(const std::string& ns) {
  auto op = c10::Dispatcher::singleton().findSchema({ns + "::reset_calls", ""});
  if (op) op->typed<void()>().call();
}

uint64_t hub_calls(Registry& r) {
  for (const auto& s : r.report()) {
    if (s.slot != kMsDeformAttn.name) continue;
    for (const auto& c : s.candidates) {
      if (c.name == "hub") return c.calls;
    }
  }
  return 0;
}

class HubProvider : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_dir("hub_provider");
    ASSERT_FALSE(dir_.empty());
    settings.endpoint.value = server.endpoint();
    settings.cache_dir.value = dir_ + "/cache";
    settings.lock_file.value = dir_ + "/kernels.lock";
    settings.timeout_seconds.value = 5.0;
    settings.retries = 0;
    settings.token = "test-token";
  }
  void TearDown() override { fs::remove_tree(dir_); }

  /// Serves repos/<kind> as libreyolo-test/<kind> and locks it (from the files on disk).
  hub::LockEntry serve_and_lock(const std::string& kind, const std::string& root = "") {
    const std::string path = root.empty() ? repo_of(kind) : root;
    server.add_repo("libreyolo-test/" + kind, path, kSha);
    auto entry = local_lock(path, "libreyolo-test/" + kind);
    hub::write_lock_file(settings.lock_file.value, {entry});
    return entry;
  }

  /// A registry with only the hub provider, configured by the fixture; resolved.
  std::unique_ptr<Registry> make_registry(libreyolo::kernels::Filter filter = {}) {
    auto r = std::make_unique<Registry>();
    r->declare(kMsDeformAttn);
    r->set_filter(std::move(filter));
    hub::ProviderOptions o;
    o.settings = settings;
    o.system = system;
    if (!real_capture_status) o.capturing = [this] { return capturing; };
    r->add_provider(hub::make_provider(std::move(o)));
    r->resolve();
    return r;
  }

  std::string file_url(const std::string& kind, const std::string& file) const {
    return "GET /kernels/libreyolo-test/" + kind + "/resolve/" + kSha + "/build/" + test_variant() +
           "/" + file;
  }

  std::string dir_;
  HubTestServer server;
  libreyolo::kernels::HubSettings settings;
  bool capturing = false;
  bool real_capture_status = false;  ///< the provider asks CUDA instead of `capturing`
  hub::SystemInfo system = cpu_system();
};

TEST_F(HubProvider, HappyPathMatchesThePortablePathAndCachesLikeTheHub) {
  serve_and_lock("ok");
  lylog::Capture capture;
  auto r = make_registry();
  const std::vector<std::string> expected = {file_url("ok", "metadata.json"),
                                             file_url("ok", "_libreyolo_hubtest_cpu_ok.abi3.so")};
  EXPECT_EQ(server.requests(), expected);
  EXPECT_EQ(server.authorizations(), std::vector<std::string>(2, "Bearer test-token"));
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  for (int seed = 0; seed < 3; ++seed) {
    Inputs in(seed);
    const at::Tensor got = slot_call(*r, in);
    const double diff = (got - in.portable()).abs().max().item<double>();
    std::printf("hub vs portable, seed %d: max |diff| = %.3g\n", seed, diff);
    EXPECT_LT(diff, 1e-5);
  }
  EXPECT_EQ(hub_calls(*r), 3u);
  EXPECT_EQ(capture.count(lylog::Level::warn), 0);
  EXPECT_TRUE(r->events().empty());

  // HF cache layout: snapshot entries are relative links to content-addressed blobs.
  const std::string snap =
      hub::variant_cache_dir(settings.cache_dir.value, "libreyolo-test/ok", kSha, test_variant()) +
      "/_libreyolo_hubtest_cpu_ok.abi3.so";
  ASSERT_TRUE(fs::is_symlink(snap));
  const std::string digest = hub::sha256_hex_file(snap);
  EXPECT_EQ(fs::read_link(snap), "../../../../blobs/" + digest);

  // A second process start with the warm cache: pinned commit, verified files, no request.
  server.clear();
  auto again = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(again->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
}

TEST_F(HubProvider, DigestMismatchIsRefusedBeforeLoading) {
  auto entry = serve_and_lock("ok");
  entry.variants.at(test_variant()).files["_libreyolo_hubtest_cpu_ok.abi3.so"] =
      hub::sha256_hex("tampered");
  hub::write_lock_file(settings.lock_file.value, {entry});
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_EQ(server.requests().size(), 2u);  // metadata.json, the library: refused, not retried
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].slot, kMsDeformAttn.name);
  EXPECT_EQ(r->events()[0].impl, "hub");
  EXPECT_EQ(
      r->events()[0].reason.rfind("digest: downloaded build/" + test_variant() +
                                      "/_libreyolo_hubtest_cpu_ok.abi3.so of libreyolo-test/ok@",
                                  0),
      0u)
      << r->events()[0].reason;
  // The mismatching bytes were not kept.
  EXPECT_FALSE(fs::exists(hub::repo_cache_dir(settings.cache_dir.value, "libreyolo-test/ok") +
                          "/blobs/" + hub::sha256_hex("tampered")));
  Inputs in(1);
  EXPECT_LT((slot_call(*r, in) - in.portable()).abs().max().item<double>(), 1e-7);
}

TEST_F(HubProvider, UnpinnedLockIsRefusedAtStartUpWithoutRequests) {
  auto entry = serve_and_lock("ok");
  entry.sha = "main";
  entry.revision = "main";
  hub::write_lock_file(settings.lock_file.value, {entry});
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason,
            "unpinned: libreyolo-test/ok in " + settings.lock_file.value +
                " is not pinned: sha 'main' is not a 40-hex commit (revision 'main'); pin it with "
                "`libreyolo-server kernels lock`");
}

TEST_F(HubProvider, MissingLockFile) {
  // Explicit lock file that does not exist: unlocked, one warning.
  {
    lylog::Capture capture;
    auto r = make_registry();
    EXPECT_EQ(capture.count(lylog::Level::warn, "does not exist"), 1);
    EXPECT_EQ(r->events().size(), 1u);
  }
  // Default place next to the configuration, never created: nothing pinned, no warning.
  settings.lock_file.value.clear();
  settings.config_file = dir_ + "/server.yaml";
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_EQ(capture.count(lylog::Level::warn), 0);
  EXPECT_EQ(capture.count(lylog::Level::info, "no hub kernel is pinned"), 1);
  EXPECT_TRUE(r->events().empty());
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(HubProvider, NoMatchingVariantLogsEveryReason) {
  const auto sys = cpu_system();
  const std::string mm = std::to_string(sys.torch_major) + std::to_string(sys.torch_minor);
  const std::string other = std::to_string(sys.torch_major) + std::to_string(sys.torch_minor + 1);
  hub::LockEntry e;
  e.repo_id = "libreyolo-test/none";
  e.sha = kSha;
  for (const std::string v :
       {"torch" + other + "-cxx11-cpu-" + sys.cpu + "-linux",
        "torch-stable-abi" + other + "-cpu-" + sys.cpu + "-linux",
        "torch" + mm + "-cxx11-cu126-" + sys.cpu + "-linux",
        "torch" + mm + "-cxx11-cpu-riscv64-linux", std::string("torch-cpu")}) {
    e.variants[v].files["metadata.json"] = std::string(64, '0');
  }
  hub::write_lock_file(settings.lock_file.value, {e});
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(capture.count(lylog::Level::info, " rejected: "), 5);
  EXPECT_EQ(capture.count(lylog::Level::info, "rejected: Torch " + std::to_string(sys.torch_major) +
                                                  "." + std::to_string(sys.torch_minor + 1)),
            1);
  EXPECT_EQ(capture.count(lylog::Level::info, "rejected: backend cu126 != cpu"), 1);
  EXPECT_EQ(capture.count(lylog::Level::info, "rejected: CPU riscv64 != "), 1);
  EXPECT_EQ(capture.count(lylog::Level::info, "rejected: pure-Python variant"), 1);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(
      r->events()[0].reason.rfind("no_variant: no locked build variant of libreyolo-test/none@", 0),
      0u);
}

TEST_F(HubProvider, OfflineUsesTheCacheOnly) {
  serve_and_lock("ok");
  make_registry();  // warms the cache
  ASSERT_EQ(server.requests().size(), 2u);
  server.clear();
  settings.offline.value = true;
  settings.endpoint.value = "http://127.0.0.1:" + std::to_string(HubTestServer::unused_port());
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  EXPECT_EQ(capture.count(lylog::Level::warn), 0);
  Inputs in(7);
  EXPECT_LT((slot_call(*r, in) - in.portable()).abs().max().item<double>(), 1e-5);

  // A cached file altered after download is refused offline (no re-download possible).
  const std::string meta =
      hub::variant_cache_dir(settings.cache_dir.value, "libreyolo-test/ok", kSha, test_variant()) +
      "/metadata.json";
  const std::string blob = fs::real_path(meta);
  ::unlink(meta.c_str());
  fs::write(meta, "{}");
  auto tampered = make_registry();
  EXPECT_EQ(tampered->resolve(kMsDeformAttn.name), std::nullopt);
  ASSERT_EQ(tampered->events().size(), 1u);
  EXPECT_EQ(tampered->events()[0].reason.rfind("digest: cached ", 0), 0u)
      << tampered->events()[0].reason;
  EXPECT_TRUE(fs::exists(blob));
}

TEST_F(HubProvider, OfflineColdCacheFallsBack) {
  serve_and_lock("ok");
  settings.offline.value = true;
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason.rfind("offline: offline mode and build/" + test_variant() +
                                            "/metadata.json of libreyolo-test/ok@" + kSha +
                                            " is not in the cache",
                                        0),
            0u)
      << r->events()[0].reason;
}

TEST_F(HubProvider, EndpointDownFallsBack) {
  serve_and_lock("ok");
  settings.endpoint.value = "http://127.0.0.1:" + std::to_string(HubTestServer::unused_port());
  settings.retries = 2;
  lylog::Capture capture;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = make_registry();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("endpoint down: provider gave up after %.2f s (3 attempts, backoff 0.2 + 0.4 s)\n",
              seconds);
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(
      r->events()[0].reason.rfind(
          "download: GET " + settings.endpoint.value + "/kernels/libreyolo-test/ok/resolve/", 0),
      0u)
      << r->events()[0].reason;
  EXPECT_NE(r->events()[0].reason.find("(after 3 attempts)"), std::string::npos)
      << r->events()[0].reason;
  EXPECT_LT(seconds, settings.timeout_seconds.value);
}

TEST_F(HubProvider, SlowEndpointTimesOutWithinTheConfiguredLimit) {
  HubTestServer slow(HubTestServer::Mode::slow);
  serve_and_lock("ok");
  settings.endpoint.value = slow.endpoint();
  settings.timeout_seconds.value = 0.5;
  settings.retries = 3;
  lylog::Capture capture;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = make_registry();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("slow endpoint: provider gave up after %.2f s (limit 0.5 s)\n", seconds);
  EXPECT_EQ(slow.requests().size(), 1u);
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_NE(r->events()[0].reason.find("timed out"), std::string::npos) << r->events()[0].reason;
  EXPECT_LT(seconds, 0.5 + 1.0);  // the deadline covers every attempt and backoff
  slow.stop();
}

TEST_F(HubProvider, OpThrowingAtTheFirstCallDisablesHubWithCorrectAnswers) {
  serve_and_lock("throw1");
  lylog::Capture capture;
  auto r = make_registry();
  reset_test_op_calls("_libreyolo_hubtest_cpu_throw1");
  ASSERT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  for (int i = 0; i < 3; ++i) {
    Inputs in(100 + i);
    EXPECT_LT((slot_call(*r, in) - in.portable()).abs().max().item<double>(), 1e-7);
  }
  EXPECT_EQ(hub_calls(*r), 0u);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_NE(r->events()[0].reason.find("injected failure at call 1"), std::string::npos);
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
}

TEST_F(HubProvider, OpThrowingAtTheHundredthCallDisablesHubWithCorrectAnswers) {
  serve_and_lock("throw100");
  lylog::Capture capture;
  auto r = make_registry();
  reset_test_op_calls("_libreyolo_hubtest_cpu_throw100");
  Inputs in(5);
  const at::Tensor expected = in.portable();
  double worst = 0;
  for (int i = 0; i < 150; ++i) {
    worst = std::max(worst, (slot_call(*r, in) - expected).abs().max().item<double>());
  }
  std::printf("150 calls, hub failing from call 100: max |diff| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(hub_calls(*r), 99u);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_NE(r->events()[0].reason.find("injected failure at call 100"), std::string::npos);
}

TEST_F(HubProvider, DisabledByPolicyMakesNoRequestAndLoadsNothing) {
  serve_and_lock("ok");
  const auto from_env =
      libreyolo::kernels::policy_from_environment({{"LIBREYOLO_HUB_KERNELS", "0"}});
  std::ofstream(dir_ + "/server.yaml") << "kernels:\n  hub_kernels: off\n";
  const auto from_yaml = libreyolo::kernels::load_policy_file(dir_ + "/server.yaml", {});
  ASSERT_FALSE(from_yaml.hub_kernels.value);
  for (const auto& policy : {from_env, from_yaml}) {
    lylog::Capture capture;
    auto r = make_registry(policy.filter());
    EXPECT_TRUE(server.requests().empty());
    const auto providers = r->loaded_providers();
    EXPECT_EQ(std::count(providers.begin(), providers.end(), "hub"), 0);
    EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
    EXPECT_EQ(capture.count(lylog::Level::warn), 0);
    EXPECT_TRUE(r->events().empty());
  }
  EXPECT_FALSE(fs::exists(settings.cache_dir.value));
}

TEST_F(HubProvider, NotAnElfLibraryIsRefused) {
  const std::string root = dir_ + "/repo";
  const std::string vdir = root + "/build/" + test_variant();
  fs::make_dirs(vdir);
  std::ofstream(vdir + "/metadata.json")
      << R"({"name":"x","id":"_libreyolo_hubtest_cpu_notelf","version":1,"license":"MIT","python-depends":[],"backend":{"type":"cpu"}})";
  std::ofstream(vdir + "/_libreyolo_hubtest_cpu_notelf.abi3.so")
      << "#!/bin/sh\necho not a library\n";
  serve_and_lock("notelf", root);
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_EQ(server.requests().size(), 2u);
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason.rfind("dlopen: ", 0), 0u) << r->events()[0].reason;
  EXPECT_NE(r->events()[0].reason.find("is not an ELF shared library"), std::string::npos);
}

TEST_F(HubProvider, LibraryWithoutTheOpIsRefused) {
  serve_and_lock("noop");
  lylog::Capture capture;
  auto r = make_registry();
  EXPECT_EQ(capture.count(lylog::Level::warn), 1);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].reason,
            "schema: _libreyolo_hubtest_cpu_noop.abi3.so registers no op "
            "_libreyolo_hubtest_cpu_noop::ms_deform_attn_forward");
  EXPECT_EQ(r->resolve(kMsDeformAttn.name), std::nullopt);
}

TEST_F(HubProvider, WrongSchemaIsRefused) {
  serve_and_lock("badschema");
  auto r = make_registry();
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(
      r->events()[0].reason,
      std::string(
          "schema: _libreyolo_hubtest_cpu_badschema::ms_deform_attn_forward has schema "
          "'ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor "
          "level_start_index, Tensor sampling_loc, Tensor attn_weight) -> Tensor', expected '") +
          libreyolo::kernels::kMsDeformAttnForwardSchema + "'");
}

TEST_F(HubProvider, MetadataDigestIsChecked) {
  const std::string root = dir_ + "/repo";
  const std::string vdir = root + "/build/" + test_variant();
  fs::make_dirs(vdir);
  const std::string lib = "_libreyolo_hubtest_cpu_ok.abi3.so";
  fs::write(vdir + "/" + lib, fs::read(repo_of("ok") + "/build/" + test_variant() + "/" + lib));
  auto write_meta = [&](const std::string& b64) {
    nlohmann::json m = {{"name", "x"},
                        {"id", "_libreyolo_hubtest_cpu_ok"},
                        {"version", 1},
                        {"license", "MIT"},
                        {"python-depends", nlohmann::json::array()},
                        {"backend", {{"type", "cpu"}}},
                        {"digest", {{"algorithm", "sha256"}, {"files", {{lib, b64}}}}}};
    std::ofstream(vdir + "/metadata.json", std::ios::trunc) << m.dump();
  };
  write_meta("AAAA");
  serve_and_lock("digest", root);
  auto r = make_registry();
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(
      r->events()[0].reason.rfind("digest: metadata.json digest mismatch for " + lib + ": ", 0), 0u)
      << r->events()[0].reason;

  write_meta(hub::digest_base64_file(vdir + "/" + lib, "sha256"));
  serve_and_lock("digest", root);
  auto good = make_registry();
  EXPECT_TRUE(good->events().empty());
  EXPECT_EQ(good->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
}

TEST_F(HubProvider, NothingIsFetchedOrLoadedDuringCudaGraphCapture) {
  serve_and_lock("ok");
  capturing = true;
  auto r = make_registry();
  EXPECT_TRUE(server.requests().empty());
  ASSERT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  Inputs in(3);
  EXPECT_LT((slot_call(*r, in) - in.portable()).abs().max().item<double>(), 1e-7);  // declined
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(hub_calls(*r), 0u);
  capturing = false;
  EXPECT_LT((slot_call(*r, in) - in.portable()).abs().max().item<double>(), 1e-5);  // loads, runs
  EXPECT_EQ(server.requests().size(), 2u);
  EXPECT_EQ(hub_calls(*r), 1u);
  EXPECT_TRUE(r->events().empty());
}

// GPU machine: a CUDA build of the in-tree kernel in the Hub layout (tests/hub, repos/cuda),
// selected for this process's CUDA version and compute capability, matches the portable path.
TEST_F(HubProvider, CudaArtifactMatchesThePortablePath) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!fs::exists(repo_of("cuda"))) GTEST_SKIP() << "built without the CUDA kernels";
  system = hub::detect_system();
  std::printf("process: %s\n", system.describe().c_str());
  serve_and_lock("cuda");
  lylog::Capture capture;
  auto r = make_registry();
  for (const auto& e : r->events()) std::printf("event: %s\n", e.reason.c_str());
  ASSERT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  EXPECT_EQ(server.requests().size(), 2u);
  double worst = 0;
  for (int seed = 0; seed < 3; ++seed) {
    Inputs in(seed);
    in.value = in.value.cuda();
    in.loc = in.loc.cuda();
    in.attn = in.attn.cuda();
    in.shapes_t = libreyolo::kernels::spatial_shapes_tensor(in.shapes, in.value.device());
    in.start_t = libreyolo::kernels::level_start_index(in.shapes, in.value.device());
    const at::Tensor got = slot_call(*r, in);
    ASSERT_TRUE(got.is_cuda());
    worst = std::max(worst, (got - in.portable()).abs().max().item<double>());
  }
  std::printf("hub CUDA build vs portable: max |diff| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(hub_calls(*r), 3u);
  Inputs cpu(9);  // CPU tensors: the CUDA build declines, the portable path answers
  EXPECT_LT((slot_call(*r, cpu) - cpu.portable()).abs().max().item<double>(), 1e-7);
  EXPECT_EQ(hub_calls(*r), 3u);
  EXPECT_EQ(capture.count(lylog::Level::warn), 0);
}

#ifdef HUB_TEST_CUDA_GRAPHS
uint64_t hub_declines(Registry& r, const std::string& reason) {
  for (const auto& s : r.report()) {
    for (const auto& c : s.candidates) {
      if (s.slot == kMsDeformAttn.name && c.name == "hub") {
        auto it = c.declined.find(reason);
        return it == c.declined.end() ? 0 : it->second;
      }
    }
  }
  return 0;
}

// GPU machine, real CUDA graph capture: the hub op is never first called inside a capture (the
// portable path is captured instead); once warmed up outside, it is captured and replays right.
TEST_F(HubProvider, CudaGraphCaptureNeverRunsAColdHubKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!fs::exists(repo_of("cuda"))) GTEST_SKIP() << "built without the CUDA kernels";
  system = hub::detect_system();
  real_capture_status = true;
  serve_and_lock("cuda");
  auto r = make_registry();
  ASSERT_EQ(r->resolve(kMsDeformAttn.name), std::optional<std::string>("hub"));
  Inputs in(11);
  in.value = in.value.cuda();
  in.loc = in.loc.cuda();
  in.attn = in.attn.cuda();
  in.shapes_t = libreyolo::kernels::spatial_shapes_tensor(in.shapes, in.value.device());
  in.start_t = libreyolo::kernels::level_start_index(in.shapes, in.value.device());
  const at::Tensor eager = in.portable();
  auto capture_once = [&](bool& was_capturing) {
    at::cuda::CUDAGraph graph;
    at::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(at::cuda::getStreamFromPool());
      graph.capture_begin();
      was_capturing = hub::cuda_graph_capturing();
      out = slot_call(*r, in);
      graph.capture_end();
    }
    graph.replay();
    at::cuda::device_synchronize();
    return (out - eager).abs().max().item<double>();
  };
  bool was_capturing = false;
  const double cold = capture_once(was_capturing);
  EXPECT_TRUE(was_capturing);
  EXPECT_EQ(hub_calls(*r), 0u);
  EXPECT_EQ(hub_declines(*r, "hub: first call inside CUDA graph capture"), 1u);
  EXPECT_LT(cold, 1e-5);
  EXPECT_FALSE(hub::cuda_graph_capturing());
  slot_call(*r, in);  // warm-up outside the capture
  EXPECT_EQ(hub_calls(*r), 1u);
  const double warm = capture_once(was_capturing);
  EXPECT_EQ(hub_calls(*r), 2u);
  std::printf(
      "CUDA graph replay vs eager portable: cold (portable captured) %.3g, warm (hub captured) "
      "%.3g\n",
      cold, warm);
  EXPECT_LT(warm, 1e-5);
  EXPECT_TRUE(r->events().empty());
}
#endif

TEST_F(HubProvider, LockAndDownloadCommands) {
  server.add_repo("libreyolo-test/ok", repo_of("ok"), kSha, {"v1"});
  auto c = hub::connection_for(settings);
  const auto entry = hub::lock_repo(c, "ms_deform_attn", "libreyolo-test/ok", "v1");
  const std::vector<std::string> expected = {
      "GET /api/kernels/libreyolo-test/ok/revision/v1",
      std::string("GET /api/kernels/libreyolo-test/ok/tree/") + kSha + "/build?recursive=true",
      file_url("ok", "metadata.json")};  // the library's SHA-256 comes from its LFS entry
  EXPECT_EQ(server.requests(), expected);
  EXPECT_EQ(entry.sha, kSha);
  const auto local = local_lock(repo_of("ok"), "libreyolo-test/ok");
  EXPECT_EQ(entry.variants.at(test_variant()).files, local.variants.at(test_variant()).files);
  std::ifstream ref(hub::repo_cache_dir(settings.cache_dir.value, "libreyolo-test/ok") +
                    "/refs/v1");
  std::string ref_sha;
  ref >> ref_sha;
  EXPECT_EQ(ref_sha, kSha);

  server.clear();
  hub::download_locked(c, entry);
  EXPECT_EQ(server.requests(),
            std::vector<std::string>{file_url("ok", "_libreyolo_hubtest_cpu_ok.abi3.so")});
  server.clear();
  hub::download_locked(c, entry);
  EXPECT_TRUE(server.requests().empty());

  // Resumable: a fresh cache holding the first 1000 bytes of the library as a partial blob.
  settings.cache_dir.value = dir_ + "/cache2";
  c = hub::connection_for(settings);
  const std::string lib_digest =
      entry.variants.at(test_variant()).files.at("_libreyolo_hubtest_cpu_ok.abi3.so");
  const std::string blobs =
      hub::repo_cache_dir(settings.cache_dir.value, "libreyolo-test/ok") + "/blobs";
  fs::make_dirs(blobs);
  fs::write(
      blobs + "/" + lib_digest + ".incomplete",
      fs::read(repo_of("ok") + "/build/" + test_variant() + "/_libreyolo_hubtest_cpu_ok.abi3.so")
          .substr(0, 1000));
  server.clear();
  const std::string path =
      hub::ensure_file(c, entry, test_variant(), "_libreyolo_hubtest_cpu_ok.abi3.so");
  EXPECT_EQ(server.requests(),
            std::vector<std::string>{file_url("ok", "_libreyolo_hubtest_cpu_ok.abi3.so") +
                                     " range=bytes=1000-"});
  EXPECT_EQ(hub::sha256_hex_file(path), lib_digest);
}

}  // namespace
