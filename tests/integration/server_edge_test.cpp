// Edge cases against the daemon: a second daemon on the same gRPC address, images
// with an EXIF orientation, the top_k rule, echoed names of 15,000 bytes, and relative paths of a
// configuration file with /active and --print-config showing them resolved.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

std::string binary() { return std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-server"; }

/// Runs the binary with `args`, stdout and stderr to `out_file`; returns the pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& out_file) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::freopen(out_file.c_str(), "w", stdout);
    (void)f;
    ::dup2(::fileno(stdout), 2);
    std::vector<char*> argv;
    std::string b = binary();
    argv.push_back(b.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("LIBREYOLO_HUB_KERNELS", "0", 1);
    ::execv(b.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

/// Exit status of `pid`, -signal when killed; kills it and returns -1000 after `timeout_s`.
int wait_exit(pid_t pid, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1000;
}

ServerConfig no_http(const fs::path& repo) {
  auto c = loopback_config(repo);
  c.http_address.value = "off";
  return c;
}

// ---- item 1: one gRPC address, one daemon --------------------------------------------------

TEST(EdgeGrpcAddress, SecondDaemonOnTheSameAddressIsRefused) {
  // gRPC's SO_REUSEPORT default let the second bind too; the kernel then split new connections
  // between the two daemons.
  const auto repo = temp_dir("edge-reuse");
  Daemon first(no_http(repo));
  first.start();
  const std::string address = "127.0.0.1:" + std::to_string(first.grpc_port());
  auto config = no_http(repo);
  config.grpc_address.value = address;
  Daemon second(config);
  std::string error;
  try {
    second.start();
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "gRPC: cannot listen on " + address +
                       " (the port is in use, e.g. by another daemon, or the address is not "
                       "local)");
  // Every new connection still reaches the first daemon.
  for (int i = 0; i < 5; ++i) {
    rpc::Client c(address);
    EXPECT_EQ(c.call("ServerLive").text, "live: true\n");
  }
  first.stop(0.5);
  remove_tree(repo);
}

TEST(EdgeGrpcAddress, SecondDaemonBinaryExitsOneNamingTheAddress) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("edge-reuse-bin");
  fs::create_directories(dir / "repo");
  Daemon first(no_http(dir / "repo"));
  first.start();
  const std::string address = "127.0.0.1:" + std::to_string(first.grpc_port());
  const auto out = (dir / "out.txt").string();
  const pid_t pid = spawn({"--model-repository", (dir / "repo").string(), "--grpc-address", address,
                           "--http-address", "off"},
                          out);
  EXPECT_EQ(wait_exit(pid, 60), 1);
  EXPECT_NE(read_file(out).find("start-up failed: gRPC: cannot listen on " + address + " ("),
            std::string::npos)
      << read_file(out);
  first.stop(0.5);
  remove_tree(dir);
}

// ---- items 3, 4, 5: requests ----------------------------------------------------------------

class EdgeServing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = new fs::path(temp_dir("edge-repo"));
    add_fake_model(*repo_, "fake", "");
    add_fake_model(*repo_, "fake_k2", "top_k: 2\n");
    add_fixture_model(*repo_, "vit_k2", "vit_tiny", "warmup: false\ntop_k: 2\n");
    add_fake_model(*repo_, "fake_window",
                   "max_batch_size: 4\nmax_queue_delay_microseconds: 600000\nmax_queue_size: 8\n");
    daemon_ = new Daemon(loopback_config(*repo_), fake_or_real());
    daemon_->start();
    address_ = new std::string("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  static void TearDownTestSuite() {
    delete daemon_;
    remove_tree(*repo_);
    delete repo_;
    delete address_;
  }
  void SetUp() override { FakeState::get().reset(); }

  static rpc::InferResult infer_image(const std::string& model, const std::string& file,
                                      const std::string& extra = "") {
    rpc::Client c(*address_);
    return c.infer("model_name: \"" + model +
                       "\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } " + extra,
                   {rpc::pack_bytes({read_file(file)})});
  }

  static fs::path* repo_;
  static Daemon* daemon_;
  static std::string* address_;
};
fs::path* EdgeServing::repo_ = nullptr;
Daemon* EdgeServing::daemon_ = nullptr;
std::string* EdgeServing::address_ = nullptr;

TEST_F(EdgeServing, ExifOrientedJpegGivesBoxesInTheDisplayedFrame) {
  // The fake detector's query q has the normalised box (cx, cy, w, h) = (0.2q + 0.2, 0.5, 0.1,
  // 0.2). orientation_1.jpg is 37x23 (WxH) as stored and displayed; orientation_6.jpg stores the
  // same 37x23 pixels but is displayed 23x37 (transformers' load_image turns it): its boxes are
  // in the 23x37 frame.
  for (const auto& [file, w, h] : std::vector<std::tuple<std::string, double, double>>{
           {"orientation_1.jpg", 37, 23}, {"orientation_6.jpg", 23, 37}}) {
    const auto r = infer_image("fake", kFixtures + "/images/exif/" + file);
    ASSERT_TRUE(r.ok()) << file << ": " << r.message;
    const auto boxes = values<float>(r.output("boxes").data);
    ASSERT_EQ(boxes.size(), 16u) << file;
    std::vector<double> x0;
    for (int j = 0; j < 4; ++j) {
      x0.push_back(boxes[j * 4]);
      EXPECT_NEAR(boxes[j * 4 + 1], 0.4 * h, 1e-4) << file;  // y0 = (cy - h/2) * H
      EXPECT_NEAR(boxes[j * 4 + 3], 0.6 * h, 1e-4) << file;
    }
    std::sort(x0.begin(), x0.end());
    for (int q = 0; q < 4; ++q) EXPECT_NEAR(x0[q], (0.2 * q + 0.15) * w, 1e-4) << file;
  }
}

TEST_F(EdgeServing, TopKZeroMeansTheModelsDefaultForEveryTask) {
  const std::string jpg = kFixtures + "/images/coffee.jpg";
  auto k = [](int64_t v) {
    return "parameters { key: \"top_k\" value { int64_param: " + std::to_string(v) + " } }";
  };
  // Detector: serving.yaml top_k 2; no parameter, 0 (before: 0 meant all 4 queries), 3.
  for (const auto& [extra, n] : std::vector<std::pair<std::string, int32_t>>{
           {"", 2}, {k(0), 2}, {k(3), 3}, {k(1000000000), 4}}) {
    const auto r = infer_image("fake_k2", jpg, extra);
    ASSERT_TRUE(r.ok()) << extra << ": " << r.message;
    EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{n}) << extra;
  }
  // Classifier: serving.yaml top_k 2; 0 (before: INVALID_ARGUMENT) is the same default.
  for (const auto& [extra, n] : std::vector<std::pair<std::string, int64_t>>{
           {"", 2}, {k(0), 2}, {k(4), 4}, {k(1000000000), 5}}) {
    const auto r = infer_image("vit_k2", jpg, extra);
    ASSERT_TRUE(r.ok()) << extra << ": " << r.message;
    EXPECT_EQ(r.output("scores").shape, (std::vector<int64_t>{1, n})) << extra;
  }
}

TEST_F(EdgeServing, HugeModelNameIsNotFoundWithTheNameClipped) {
  // 15,000 bytes echoed whole exceeded the client's 8 KiB metadata limit: the client saw
  // RESOURCE_EXHAUSTED "received metadata size exceeds limit" instead of NOT_FOUND.
  const std::string name(15000, 'm');
  const std::string clipped = "'" + std::string(48, 'm') + "...' (15000 bytes)";
  const auto r = infer_image(name, kFixtures + "/images/coffee.jpg");
  EXPECT_EQ(r.code, Code::not_found) << r.message.substr(0, 200);
  EXPECT_EQ(r.message, "unknown model " + clipped);
  rpc::Client c(*address_);
  auto m = c.call("ModelMetadata", "name: \"" + name + "\"");
  EXPECT_EQ(m.code, Code::not_found) << m.message.substr(0, 200);
  EXPECT_EQ(m.message, "unknown model " + clipped);
  m = c.call("ModelMetadata", "name: \"fake\" version: \"" + std::string(15000, '7') + "\"");
  EXPECT_EQ(m.code, Code::not_found) << m.message.substr(0, 200);
  EXPECT_EQ(m.message, "model 'fake' has no version '" + std::string(48, '7') +
                           "...' (15000 bytes) (served: '1')");
  // Short names are echoed whole, control bytes escaped.
  m = c.call("ModelMetadata", "name: \"no\\tsuch\"");
  EXPECT_EQ(m.message, "unknown model 'no\\x09such'");
  // Any other echoed text (an input name) is clipped by the transport: the real status arrives.
  const auto in = c.infer("model_name: \"fake\" inputs { name: \"" + std::string(15000, 'i') +
                              "\" datatype: \"BYTES\" shape: 1 }",
                          {rpc::pack_bytes({"x"})});
  EXPECT_EQ(in.code, Code::invalid_argument) << in.message.substr(0, 200);
  EXPECT_EQ(in.message.substr(0, 18), "unexpected input '");
  EXPECT_EQ(in.message.size(), 2048u + std::string("... (15076 bytes, clipped)").size());
  EXPECT_EQ(in.message.substr(2048), "... (15076 bytes, clipped)");
}

TEST_F(EdgeServing, RequestCancelledWhileItsBatchWindowIsOpenLeavesTheModelServing) {
  // The only queued request leads a 600 ms batching window and its 100 ms deadline passes inside
  // it: Scheduler::cancel takes it out of the queue while the worker waits. The worker then read
  // front() of the empty queue (undefined behaviour: the daemon died with "Promise already
  // satisfied" in the peers' deadline test).
  rpc::Client c(*address_);
  const auto jpg = rpc::pack_bytes({read_file(kFixtures + "/images/coffee.jpg")});
  const std::string req =
      "model_name: \"fake_window\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 }";
  for (int i = 0; i < 3; ++i) {
    const auto late = c.infer(req, {jpg}, 0.1);
    EXPECT_EQ(late.code, Code::deadline_exceeded) << late.message;
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // the window closes empty
    const auto ok = c.infer(req, {jpg}, 10.0);
    ASSERT_TRUE(ok.ok()) << i << ": " << ok.message;
    EXPECT_EQ(values<int32_t>(ok.output("num_detections").data), std::vector<int32_t>{4});
  }
}

// ---- item 7: relative paths of a configuration file -----------------------------------------

TEST(EdgeConfigPaths, RelativePathsOfAFileResolveAgainstItsFolder) {
  const auto dir = temp_dir("edge-paths");
  fs::create_directories(dir / "conf");
  fs::create_directories(dir / "repo");
  add_fake_model(dir / "repo", "fake", "");
  const auto file = (dir / "conf" / "s.yaml").string();
  write_file(file,
             "model_repository: ../repo\nkernels:\n  hub:\n    lock_file: locks/k.lock\n"
             "    cache_dir: ./cache\n");
  // From a current directory where ../repo does not exist.
  const auto c = load_config(file, {}, {{"LIBREYOLO_HUB_KERNELS", "0"}});
  EXPECT_EQ(c.model_repository.value, (dir / "repo").string());
  EXPECT_EQ(c.model_repository.origin, file + ":1:19");
  EXPECT_EQ(c.kernels.hub.lock_file.value, (dir / "conf" / "locks" / "k.lock").string());
  EXPECT_EQ(c.kernels.hub.cache_dir.value, (dir / "conf" / "cache").string());
  // A flag stays relative to the current directory; absolute paths are kept.
  Overrides o;
  o.model_repository = "rel/repo";
  const auto flagged = load_config(file, o, {});
  EXPECT_EQ(flagged.model_repository.value, "rel/repo");
  // Shown absolute, so that the printed configuration reads back to the same folder anywhere.
  EXPECT_NE(
      describe(flagged).find("model_repository: " + (fs::current_path() / "rel/repo").string() +
                             "  # flag --model-repository\n"),
      std::string::npos)
      << describe(flagged);
  write_file(dir / "abs.yaml", "model_repository: /srv/models\n");
  EXPECT_EQ(load_config((dir / "abs.yaml").string(), {}, {}).model_repository.value, "/srv/models");
  // --print-config shows the resolved path and where it came from.
  EXPECT_NE(
      describe(c).find("model_repository: " + (dir / "repo").string() + "  # " + file + ":1:19\n"),
      std::string::npos)
      << describe(c);
  // /active shows model_repository (it did not) with its source.
  auto served = c;
  served.grpc_address.value = "127.0.0.1:0";
  served.http_address.value = "127.0.0.1:" + std::to_string(free_port());
  served.device.value = "cpu";
  Daemon d(served, fake_or_real());
  d.start();
  EXPECT_TRUE(d.core().ready());
  const auto active = nlohmann::json::parse(http_get(d.http_port(), "/active").body);
  EXPECT_EQ(
      active["server"]["model_repository"],
      (nlohmann::json{
          {"value", (dir / "repo").string()}, {"source", "file"}, {"origin", file + ":1:19"}}))
      << active["server"].dump();
  d.stop(0.5);
  remove_tree(dir);
}

}  // namespace
}  // namespace libreyolo::server
