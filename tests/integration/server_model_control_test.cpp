// model_control: explicit (Triton's explicit mode) through a real gRPC client: names that are
// not plain folder names of the repository are refused with INVALID_ARGUMENT and logged; a
// model added after start-up loads; a higher version folder reloads; a failed reload keeps the
// served version; unload turns the model UNAVAILABLE while queued requests finish.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/cpu/parallel.h"
#include "log/log.h"
#include "models/runtime/intra_op_threads.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

/// FakeDetector for every folder; a folder holding a file named BROKEN fails to load.
ModelFactory fake_factory() {
  return [](const std::string& dir, const models::LoadOptions&) -> std::unique_ptr<models::Model> {
    if (::access((dir + "/BROKEN").c_str(), F_OK) == 0) {
      throw std::runtime_error(dir + "/model.safetensors: broken checkpoint (test)");
    }
    return std::make_unique<FakeDetector>();
  };
}

ServerConfig control_config(const fs::path& repo, const std::string& model_control) {
  auto c = loopback_config(repo);
  c.http_address.value = "off";
  c.model_control.value = model_control;
  if (model_control == "explicit") c.load_models.value = {"*"};  // Triton: --load-model "*"
  return c;
}

/// One 8x8 image as pixel_values: the fake's outputs do not depend on the pixels, and its
/// boxes scale to the 8x8 target size.
const std::string kPixels = std::string(3 * 8 * 8 * 4, '\0');

std::string pv_request(const std::string& model, const std::string& extra = "") {
  return "model_name: \"" + model +
         "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, 8] } " + extra;
}

/// Adds version folder <repo>/<name>/<version> with the fake checkpoint of add_fake_model.
void add_version(const fs::path& repo, const std::string& name, const std::string& version) {
  const fs::path v1 = repo / name / "1", dir = repo / name / version;
  for (const char* f : {"config.json", "preprocessor_config.json", "model.safetensors"}) {
    write_file(dir / f, read_file((v1 / f).string()));
  }
}

/// realpath(3) of `p` (what the daemon reports as a link's target).
std::string real(const fs::path& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p.string();
}

/// The index entry of `name` in RepositoryIndex text ("" when absent).
std::string index_entry(const std::string& index_text, const std::string& name) {
  const auto at = index_text.find("models {\n  name: \"" + name + "\"\n");
  if (at == std::string::npos) return "";
  return index_text.substr(at, index_text.find("}\n", at) + 2 - at);
}

class ModelControl : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeState::get().reset();
    repo_ = temp_dir("control");
    outside_ = temp_dir("outside");
    add_fake_model(repo_, "fake", "max_batch_size: 1\n");
    daemon_ = std::make_unique<Daemon>(control_config(repo_, "explicit"), fake_factory());
    daemon_->start();
    FakeState::get().reset();  // forget the warm-up forward
    client_ = std::make_unique<rpc::Client>("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    FakeState::get().reset();
    remove_tree(repo_);
    remove_tree(outside_);
  }
  rpc::CallResult load(const std::string& name) {
    return client_->call("RepositoryModelLoad", "model_name: \"" + rpc::text_escape(name) + "\"");
  }
  rpc::CallResult unload(const std::string& name) {
    return client_->call("RepositoryModelUnload", "model_name: \"" + rpc::text_escape(name) + "\"");
  }
  /// Checks the fake's outputs for one 8x8 image; returns the response's model_version.
  std::string infer_ok(const std::string& model) {
    auto r = client_->infer(pv_request(model), {kPixels});
    EXPECT_TRUE(r.ok()) << model << ": " << api::code_name(r.code) << " " << r.message;
    if (!r.ok()) return "";
    EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{4});
    std::multiset<long> x0;
    const auto boxes = values<float>(r.output("boxes").data);
    for (std::size_t j = 0; j + 3 < boxes.size(); j += 4) x0.insert(std::lround(boxes[j] * 10));
    EXPECT_EQ(x0, (std::multiset<long>{12, 28, 44, 60}));  // (0.2q + 0.15) * 8, x10
    return r.model_version;
  }

  fs::path repo_, outside_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<rpc::Client> client_;
};

struct BadName {
  std::string name;
  std::string problem;  ///< the message after "model_name '<printable>': "
  std::string printable;
};

TEST_F(ModelControl, NamesThatAreNotPlainFolderNamesAreInvalidArgument) {
  // A real model outside the repository, reached through a symbolic link added after start-up.
  add_fake_model(outside_, "secret", "");
  ASSERT_EQ(::symlink((outside_ / "secret").c_str(), (repo_ / "escape").c_str()), 0);
  ASSERT_EQ(::symlink("../", (repo_ / "parent").c_str()), 0);
  const std::string sep =
      "contains a path separator ('/' or '\\'); a model name is a plain folder name inside the "
      "model repository, not a path";
  const std::string dots =
      "'.' and '..' are not model names; expected a folder of the model repository";
  const std::vector<BadName> cases = {
      {"", "empty; expected the name of a folder of the model repository", ""},
      {".", dots, "."},
      {"..", dots, ".."},
      {"../fake", sep, "../fake"},
      {"fake/..", sep, "fake/.."},
      {"fake/1", sep, "fake/1"},
      {"/etc", sep, "/etc"},
      {(outside_ / "secret").string(), sep, (outside_ / "secret").string()},
      {"..\\fake", sep, "..\\x5cfake"},
      {std::string(256, 'a'), "longer than 255 bytes (256)", std::string(80, 'a') + "..."},
      {"fa\nke", "contains a control character", "fa\\x0ake"},
      {"fake\x1b[2J", "contains a control character", "fake\\x1b[2J"},
      {"del\x7f", "contains a control character", "del\\x7f"},
      {"escape",
       "the folder " + (repo_ / "escape").string() +
           " is a symbolic link resolving outside the model repository (to " +
           real(outside_ / "secret") + ")",
       "escape"},
      {"parent",
       "the folder " + (repo_ / "parent").string() +
           " is a symbolic link resolving outside the model repository (to " +
           real(repo_.parent_path()) + ")",
       "parent"},
  };
  log::Capture capture;
  for (const auto& c : cases) {
    const std::string expected = "model_name '" + c.printable + "': " + c.problem;
    auto r = load(c.name);
    EXPECT_EQ(r.code, Code::invalid_argument) << c.printable << ": " << r.message;
    EXPECT_EQ(r.message, expected);
  }
  // Unload checks the name the same way (the links are not models of the daemon: NOT_FOUND).
  for (const auto& c : cases) {
    auto r = unload(c.name);
    if (c.name == "escape" || c.name == "parent") {
      EXPECT_EQ(r.code, Code::not_found) << r.message;
      EXPECT_EQ(r.message, "unknown model '" + c.name + "'");
    } else {
      EXPECT_EQ(r.code, Code::invalid_argument) << c.printable << ": " << r.message;
      EXPECT_EQ(r.message, "model_name '" + c.printable + "': " + c.problem);
    }
  }
  const int refused = capture.count(log::Level::warn, "model control: refused model_name '");
  std::cout << "refused and logged: " << refused << " of " << 2 * cases.size() - 2 << "\n";
  EXPECT_EQ(refused, static_cast<int>(2 * cases.size() - 2));
  // No control character reaches the log.
  for (const auto& line : capture.lines()) {
    if (line.text.find("model control: refused") == std::string::npos) continue;
    for (unsigned char ch : line.text) EXPECT_TRUE(ch >= 0x20 && ch != 0x7f) << line.text;
  }
  // Nothing was loaded or unloaded; a 255-byte name is a name (no such folder: NOT_FOUND).
  auto idx = client_->call("RepositoryIndex");
  EXPECT_EQ(idx.text, "models {\n  name: \"fake\"\n  version: \"1\"\n  state: \"READY\"\n}\n");
  auto r = load(std::string(255, 'a'));
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "unknown model '" + std::string(255, 'a') + "': no folder " +
                           (repo_ / std::string(255, 'a')).string() + " in the repository");
  EXPECT_EQ(infer_ok("fake"), "1");
  EXPECT_EQ(FakeState::get().batches().size(), 1u) << "only the check request ran";
}

TEST_F(ModelControl, SymbolicLinkInsideTheRepositoryIsAModel) {
  ASSERT_EQ(::symlink((repo_ / "fake").c_str(), (repo_ / "alias").c_str()), 0);
  auto r = load("alias");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(infer_ok("alias"), "1");
}

TEST_F(ModelControl, AddedModelLoadsNewVersionReloadsUnloadTurnsUnavailable) {
  auto& c = *client_;
  // Not in the repository yet.
  auto r = load("added");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "unknown model 'added': no folder " + (repo_ / "added").string() +
                           " in the repository");
  auto inf = c.infer(pv_request("added"), {kPixels});
  EXPECT_EQ(inf.code, Code::not_found);
  EXPECT_EQ(inf.message, "unknown model 'added'");

  // Added after start-up: RepositoryModelLoad re-scans that folder.
  add_fake_model(repo_, "added", "max_batch_size: 2\n");
  r = load("added");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(c.call("ModelReady", "name: \"added\"").text, "ready: true\n");
  EXPECT_EQ(infer_ok("added"), "1");
  EXPECT_NE(c.call("ModelConfig", "name: \"added\"").text.find("max_batch_size: 2\n"),
            std::string::npos);
  auto idx = c.call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "added"),
            "models {\n  name: \"added\"\n  version: \"1\"\n  state: \"READY\"\n}\n")
      << idx;

  // A higher version folder and a new serving.yaml: load reloads to version 2.
  add_version(repo_, "added", "2");
  write_file(repo_ / "added" / "serving.yaml", "max_batch_size: 3\n");
  r = load("added");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(infer_ok("added"), "2");
  EXPECT_NE(c.call("ModelMetadata", "name: \"added\"").text.find("versions: \"2\"\n"),
            std::string::npos);
  EXPECT_NE(c.call("ModelConfig", "name: \"added\"").text.find("max_batch_size: 3\n"),
            std::string::npos);
  inf = c.infer(pv_request("added", "model_version: \"1\""), {kPixels});
  EXPECT_EQ(inf.code, Code::not_found);
  EXPECT_EQ(inf.message, "model 'added' has no version '1' (served: '2')");
  // Same version again: a reload, still serving.
  ASSERT_TRUE(load("added").ok());
  EXPECT_EQ(infer_ok("added"), "2");

  // A broken version 3: the load fails with the reason and version 2 keeps serving.
  add_version(repo_, "added", "3");
  write_file(repo_ / "added" / "3" / "BROKEN", "");
  r = load("added");
  EXPECT_EQ(r.code, Code::internal);
  EXPECT_EQ(r.message,
            "failed to load model 'added' version 3: " + (repo_ / "added" / "3").string() +
                "/model.safetensors: broken checkpoint (test) (version 2 keeps serving)");
  EXPECT_EQ(infer_ok("added"), "2");
  idx = c.call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "added"),
            "models {\n  name: \"added\"\n  version: \"2\"\n  state: \"READY\"\n}\n")
      << idx;
  remove_tree(repo_ / "added" / "3");

  // Unload: not ready, UNAVAILABLE for inference, UNAVAILABLE "unloaded" in the index.
  r = unload("added");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(c.call("ModelReady", "name: \"added\"").text, "");  // ready: false
  // Unloaded on purpose: the server itself stays ready (Triton's semantics).
  EXPECT_EQ(c.call("ServerReady").text, "ready: true\n");
  inf = c.infer(pv_request("added"), {kPixels});
  EXPECT_EQ(inf.code, Code::unavailable);
  EXPECT_EQ(inf.message, "model 'added' is not ready (UNAVAILABLE: unloaded)");
  idx = c.call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "added"),
            "models {\n  name: \"added\"\n  version: \"2\"\n  state: \"UNAVAILABLE\"\n  reason: "
            "\"unloaded\"\n}\n")
      << idx;
  EXPECT_EQ(c.call("RepositoryIndex", "ready: true").text,
            "models {\n  name: \"fake\"\n  version: \"1\"\n  state: \"READY\"\n}\n");
  EXPECT_TRUE(unload("added").ok()) << "unloading an unloaded model is a no-op";
  EXPECT_EQ(infer_ok("fake"), "1");  // the other model serves on

  // Loaded again.
  ASSERT_TRUE(load("added").ok());
  EXPECT_EQ(infer_ok("added"), "2");
  EXPECT_EQ(c.call("ModelReady", "name: \"added\"").text, "ready: true\n");

  r = unload("nope");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "unknown model 'nope'");
}

/// Polls grpc.health.v1 "readiness" until it reads `want` (up to 3 s); returns the last state.
std::string wait_health(rpc::Client& c, const std::string& want) {
  std::string state;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    state = c.health("readiness", 1.0).text;
    if (state == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return state;
}

// An explicit load runs on a thread of its own, and the OpenMP team its warm-up forks ends with
// it (server/lifecycle/model_lifecycle.cpp): a team left behind on the calling gRPC thread made
// libgomp throttle every team's spin-wait once the process held more OpenMP threads than cores
// (docs/BENCHMARKS.md, "The daemon's OpenMP teams"). The warm-up forward records the threads
// of a parallel_for; after the load answers, none of them lives on.
TEST_F(ModelControl, TheLoadsThreadAndItsOpenMpTeamEndWithTheLoad) {
  std::mutex mu;
  std::set<long> threads;
  {
    std::lock_guard<std::mutex> lk(FakeState::get().mu);
    FakeState::get().in_forward = [&] {
      at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
        std::lock_guard<std::mutex> tl(mu);
        threads.insert(::syscall(SYS_gettid));
      });
    };
  }
  add_fake_model(repo_, "added", "max_batch_size: 1\nwarmup: true\n");
  const auto r = load("added");
  {
    std::lock_guard<std::mutex> lk(FakeState::get().mu);
    FakeState::get().in_forward = nullptr;
  }
  ASSERT_TRUE(r.ok()) << r.message;
  std::lock_guard<std::mutex> tl(mu);
  // The load's thread and its team: as many threads as a fresh thread's intra-op count.
  ASSERT_EQ(threads.size(), static_cast<std::size_t>(models::process_intra_op_threads()))
      << "the warm-up forward did not run on a fresh thread's team";
  // A thread's /proc entry goes once it has exited (OpenMP workers leave when their team's
  // thread has ended: waited for, up to 30 s, never expected).
  const auto alive = [&] {
    std::size_t n = 0;
    for (const long t : threads) n += fs::exists("/proc/self/task/" + std::to_string(t));
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (alive() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(alive(), 0u) << "of the warm-up's " << threads.size() << " threads";
  EXPECT_EQ(infer_ok("added"), "1");
}

TEST_F(ModelControl, NewModelThatFailsIsUnavailableWithItsReason) {
  EXPECT_EQ(client_->health("readiness").text, "SERVING");
  add_fake_model(repo_, "broken", "");
  write_file(repo_ / "broken" / "1" / "BROKEN", "");
  auto r = load("broken");
  EXPECT_EQ(r.code, Code::internal);
  const std::string reason =
      (repo_ / "broken" / "1").string() + "/model.safetensors: broken checkpoint (test)";
  EXPECT_EQ(r.message, "failed to load model 'broken' version 1: " + reason);
  auto idx = client_->call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "broken"),
            "models {\n  name: \"broken\"\n  version: \"1\"\n  state: "
            "\"UNAVAILABLE\"\n  reason: \"" +
                reason + "\"\n}\n")
      << idx;
  auto inf = client_->infer(pv_request("broken"), {kPixels});
  EXPECT_EQ(inf.code, Code::unavailable);
  EXPECT_EQ(inf.message, "model 'broken' is not ready (UNAVAILABLE: " + reason + ")");
  // A repository model that is not ready: the server is not ready (ServerReady and health).
  EXPECT_EQ(client_->call("ServerReady").text, "");
  EXPECT_EQ(wait_health(*client_, "NOT_SERVING"), "NOT_SERVING");
  // Fixed on disk: the next load serves it, and the server is ready again.
  ::unlink((repo_ / "broken" / "1" / "BROKEN").c_str());
  ASSERT_TRUE(load("broken").ok());
  EXPECT_EQ(infer_ok("broken"), "1");
  EXPECT_EQ(client_->call("ServerReady").text, "ready: true\n");
  EXPECT_EQ(wait_health(*client_, "SERVING"), "SERVING");
}

TEST_F(ModelControl, FolderWithoutVersionFailsToLoad) {
  write_file(repo_ / "empty" / "README", "x");
  auto r = load("empty");
  EXPECT_EQ(r.code, Code::internal);
  EXPECT_EQ(r.message, "failed to load model 'empty': " + (repo_ / "empty").string() +
                           ": no numeric version folder (<model>/<N>/config.json)");
  auto idx = client_->call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "empty"),
            "models {\n  name: \"empty\"\n  state: \"UNAVAILABLE\"\n  reason: \"" +
                (repo_ / "empty").string() +
                ": no numeric version folder (<model>/<N>/config.json)\"\n}\n")
      << idx;
}

TEST_F(ModelControl, UnloadLetsQueuedRequestsFinish) {
  FakeState::get().sleep_ms = 300;
  // max_batch_size 1: the first runs 300 ms, the second waits in the queue.
  auto until = [](const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done();
  };
  auto first = client_->start_infer(pv_request("fake"), {kPixels});
  ASSERT_TRUE(until([] { return FakeState::get().batches().size() == 1; }));
  auto second = client_->start_infer(pv_request("fake"), {kPixels});
  ASSERT_TRUE(until([this] {
    return daemon_->metrics().serialize().find("libreyolo_pending_requests{model=\"fake\"} 1") !=
           std::string::npos;
  }));
  auto r = unload("fake");
  ASSERT_TRUE(r.ok()) << r.message;
  auto a = first->wait(), b = second->wait();
  EXPECT_TRUE(a.ok()) << a.message;
  EXPECT_TRUE(b.ok()) << b.message;
  EXPECT_EQ(FakeState::get().batches(), (std::vector<int64_t>{1, 1}));
  auto late = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_EQ(late.code, Code::unavailable);
  EXPECT_EQ(late.message, "model 'fake' is not ready (UNAVAILABLE: unloaded)");
}

/// The reload race made deterministic: a request is held for 300 ms right after it looked the
/// model up, while a reload to version 2 runs. The request must finish OK on the instance it
/// found (version 1); it used to be answered UNAVAILABLE "model 'fake' is not ready
/// (UNAVAILABLE: replaced by version 2)". The next request runs on version 2.
TEST_F(ModelControl, ReloadDuringALookupKeepsTheRequestOnTheOldInstance) {
  std::atomic<bool> armed{true}, held{false};
  daemon_->core().lookup_hook_for_testing = [&](const std::string& model) {
    if (model != "fake" || !armed.exchange(false)) return;
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  add_version(repo_, "fake", "2");
  std::string version, failure;
  std::thread request([&] {
    api::InferRequest req;
    req.model_name = "fake";
    api::InputTensor t;
    t.name = "pixel_values";
    t.datatype = "FP32";
    t.shape = {1, 3, 8, 8};
    t.raw = kPixels;
    req.inputs.push_back(std::move(t));
    try {
      version = daemon_->core().infer(std::move(req)).model_version;
    } catch (const api::Error& e) {
      failure = std::string(api::code_name(e.code())) + ": " + e.what();
    }
  });
  while (!held) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread reload([&] { daemon_->core().load_model("fake"); });
  reload.join();
  request.join();
  daemon_->core().lookup_hook_for_testing = nullptr;
  EXPECT_EQ(failure, "");
  EXPECT_EQ(version, "1");
  EXPECT_EQ(infer_ok("fake"), "2");
}

/// Reloads while requests are in flight are invisible to clients (Triton's explicit mode): a
/// request accepted by the old instance finishes on it, new ones go to the new instance, none
/// fails. Four threads call the core in-process while the model is reloaded 40 times, to
/// version 2 half way. (The race that answered 2 of 3756 requests UNAVAILABLE "replaced" is too
/// narrow to hit reliably here: ReloadDuringALookupKeepsTheRequestOnTheOldInstance holds a
/// request inside it.)
TEST_F(ModelControl, ReloadUnderLoadFailsNoRequest) {
  write_file(repo_ / "fake" / "serving.yaml", "max_batch_size: 4\n");
  FakeState::get().sleep_ms = 1;  // every forward spans some reloads' swaps
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, v1{0}, v2{0};
  std::mutex mu;
  std::vector<std::string> failures;
  const std::string pixels(3 * 8 * 8 * 4, '\0');
  auto worker = [&] {
    while (!stop) {
      api::InferRequest req;
      req.model_name = "fake";
      api::InputTensor t;
      t.name = "pixel_values";
      t.datatype = "FP32";
      t.shape = {1, 3, 8, 8};
      t.raw = pixels;
      req.inputs.push_back(std::move(t));
      try {
        const auto r = daemon_->core().infer(std::move(req));
        ++ok;
        (r.model_version == "2" ? v2 : v1)++;
      } catch (const api::Error& e) {
        std::lock_guard<std::mutex> lk(mu);
        failures.push_back(std::string(api::code_name(e.code())) + ": " + e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(worker);
  const int reloads = 40;
  for (int i = 0; i < reloads; ++i) {
    if (i == reloads / 2) add_version(repo_, "fake", "2");
    daemon_->core().load_model("fake");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  stop = true;
  for (auto& t : threads) t.join();
  std::cout << reloads << " reloads under 4 threads of requests: " << ok << " OK (" << v1
            << " on version 1, " << v2 << " on version 2), " << failures.size() << " failed\n";
  EXPECT_EQ(failures.size(), 0u) << (failures.empty() ? "" : failures.front());
  EXPECT_GE(ok.load(), 100);
  EXPECT_GE(v1.load(), 1);
  EXPECT_GE(v2.load(), 1);
  EXPECT_EQ(infer_ok("fake"), "2");
  const auto idx = client_->call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "fake"),
            "models {\n  name: \"fake\"\n  version: \"2\"\n  state: \"READY\"\n}\n")
      << idx;
}

TEST(ModelControlNone, LoadAndUnloadArePermissionDeniedBeforeAnyNameCheck) {
  const auto repo = temp_dir("control-none");
  add_fake_model(repo, "fake", "");
  Daemon d(control_config(repo, "none"), fake_factory());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  for (const std::string name : {"fake", "../fake", "added"}) {
    auto r = c.call("RepositoryModelLoad", "model_name: \"" + name + "\"");
    EXPECT_EQ(r.code, Code::permission_denied) << name;
    EXPECT_EQ(r.message,
              "model control is disabled (server.model_control: none): models are loaded at "
              "start-up only");
    r = c.call("RepositoryModelUnload", "model_name: \"" + name + "\"");
    EXPECT_EQ(r.code, Code::permission_denied) << name;
    EXPECT_EQ(r.message,
              "model control is disabled (server.model_control: none): models cannot be unloaded");
  }
  EXPECT_EQ(c.call("ModelReady", "name: \"fake\"").text, "ready: true\n");
  d.stop(1.0);
  remove_tree(repo);
}

/// Triton's explicit start-up: only the models of --load-model (server.load_models) load; the
/// others are scanned, listed UNAVAILABLE "unloaded" and do not make the server unready; a
/// RepositoryModelLoad brings one in later.
TEST(ModelControlExplicit, StartUpLoadsOnlyTheNamedModels) {
  const auto repo = temp_dir("control-explicit");
  for (const char* name : {"a", "b", "c"}) add_fake_model(repo, name, "");
  auto config = control_config(repo, "explicit");
  config.load_models.value = {"b"};
  Daemon d(config, fake_factory());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  const auto idx = c.call("RepositoryIndex").text;
  EXPECT_EQ(index_entry(idx, "a"),
            "models {\n  name: \"a\"\n  version: \"1\"\n  state: \"UNAVAILABLE\"\n  reason: "
            "\"unloaded\"\n}\n")
      << idx;
  EXPECT_EQ(index_entry(idx, "b"),
            "models {\n  name: \"b\"\n  version: \"1\"\n  state: \"READY\"\n}\n")
      << idx;
  EXPECT_EQ(c.call("ServerReady").text, "ready: true\n");
  EXPECT_EQ(c.call("ModelReady", "name: \"a\"").text, "");
  auto r = c.infer(pv_request("a"), {kPixels});
  EXPECT_EQ(r.code, Code::unavailable);
  EXPECT_EQ(r.message, "model 'a' is not ready (UNAVAILABLE: unloaded)");
  EXPECT_TRUE(c.call("RepositoryModelLoad", "model_name: \"a\"").ok());
  EXPECT_EQ(c.call("ModelReady", "name: \"a\"").text, "ready: true\n");
  EXPECT_TRUE(c.infer(pv_request("a"), {kPixels}).ok());
  d.stop(1.0);
  remove_tree(repo);
}

/// No --load-model in explicit mode: nothing loads (Triton), the server is ready with no model.
TEST(ModelControlExplicit, WithoutLoadModelsNothingLoads) {
  const auto repo = temp_dir("control-none-named");
  add_fake_model(repo, "fake", "");
  // control_config names "*"; this test names none.
  auto config = control_config(repo, "explicit");
  config.load_models.value.clear();
  FakeState::get().reset();
  Daemon e(config, fake_factory());
  e.start();
  rpc::Client c("127.0.0.1:" + std::to_string(e.grpc_port()));
  EXPECT_EQ(c.call("RepositoryIndex").text,
            "models {\n  name: \"fake\"\n  version: \"1\"\n  state: \"UNAVAILABLE\"\n  reason: "
            "\"unloaded\"\n}\n");
  EXPECT_EQ(c.call("ServerReady").text, "ready: true\n");
  EXPECT_TRUE(FakeState::get().batches().empty());  // not even a warm-up
  e.stop(1.0);
  remove_tree(repo);
}

/// strict_readiness (Triton's --strict-readiness): true keeps the server not ready while one
/// model failed; false makes it ready once the start-up finished, the failed model still
/// UNAVAILABLE with its reason and the good one serving.
TEST(StrictReadiness, FalseIsReadyWithAFailedModel) {
  const auto repo = temp_dir("strict");
  add_fake_model(repo, "good", "");
  fs::create_directories(repo / "broken");  // no version folder
  for (const bool strict : {true, false}) {
    auto config = control_config(repo, "none");
    config.strict_readiness.value = strict;
    Daemon d(config, fake_factory());
    d.start();
    rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
    EXPECT_EQ(c.call("ServerReady").text, strict ? "" : "ready: true\n") << strict;
    EXPECT_EQ(c.call("ModelReady", "name: \"good\"").text, "ready: true\n");
    EXPECT_EQ(c.call("ModelReady", "name: \"broken\"").text, "");
    const auto idx = c.call("RepositoryIndex").text;
    EXPECT_EQ(index_entry(idx, "broken"),
              "models {\n  name: \"broken\"\n  state: \"UNAVAILABLE\"\n  reason: \"" +
                  (repo / "broken").string() +
                  ": no numeric version folder (<model>/<N>/config.json)\"\n}\n")
        << idx;
    d.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
