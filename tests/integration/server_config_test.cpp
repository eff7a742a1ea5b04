// The daemon's configuration: defaults, file values with their origin, flag overrides, errors
// with file:line:column, per-model serving.yaml; and the real binary (--print-config, SIGTERM
// drain).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "server/config/config.h"
#include "server/config/serving_config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;

const kernels::Environment kNoEnv = {};

TEST(ServerConfig, DefaultsMatchDesign) {
  const auto c = parse_config("", "", {}, kNoEnv);
  EXPECT_EQ(c.grpc_address.value, "0.0.0.0:8001");
  EXPECT_EQ(c.http_address.value, "0.0.0.0:8000");
  EXPECT_EQ(c.drain_seconds.value, 10.0);
  EXPECT_EQ(c.max_message_bytes.value, 67108864);
  EXPECT_EQ(c.model_repository.value, "./examples/model_repository");
  EXPECT_EQ(c.device.value, "auto");
  EXPECT_EQ(c.model_control.value, "none");
  EXPECT_EQ(c.kernels.selection.value, "auto");
  EXPECT_EQ(c.grpc_address.source, Source::default_value);
}

TEST(ServerConfig, ShippedFileEqualsDefaults) {
  const std::string file = std::string(LIBREYOLO_SOURCE_DIR) + "/config/server.yaml";
  const auto c = load_config(file, {}, kNoEnv);
  const auto d = parse_config("", "", {}, kNoEnv);
  EXPECT_EQ(c.grpc_address.value, d.grpc_address.value);
  EXPECT_EQ(c.http_address.value, d.http_address.value);
  EXPECT_EQ(c.drain_seconds.value, d.drain_seconds.value);
  EXPECT_EQ(c.max_message_bytes.value, d.max_message_bytes.value);
  EXPECT_EQ(c.max_images_per_request.value, d.max_images_per_request.value);
  EXPECT_EQ(c.max_pixels_per_image.value, d.max_pixels_per_image.value);
  EXPECT_EQ(c.preprocess_threads.value, d.preprocess_threads.value);
  EXPECT_EQ(c.intra_op_threads.value, d.intra_op_threads.value);
  EXPECT_EQ(c.intra_op_threads.source, Source::file);
  // The file's ../examples/model_repository is relative to config/: the same folder as the
  // default ./examples/model_repository from the checkout's root, but from any directory.
  EXPECT_EQ(c.model_repository.value,
            (fs::path(LIBREYOLO_SOURCE_DIR) / "examples/model_repository").lexically_normal());
  EXPECT_EQ(d.model_repository.value, "./examples/model_repository");
  EXPECT_EQ(c.device.value, d.device.value);
  EXPECT_EQ(c.kernels.selection.value, d.kernels.selection.value);
  EXPECT_EQ(c.kernels.hub_kernels.value, d.kernels.hub_kernels.value);
  EXPECT_EQ(c.gpu_image_decode.value, d.gpu_image_decode.value);
  EXPECT_EQ(d.gpu_image_decode.value, "auto");  // on for 16-bit CUDA models (issue 32)
  EXPECT_EQ(c.grpc_address.source, Source::file);
  EXPECT_EQ(c.grpc_address.origin, file + ":14:17");
}

TEST(ServerConfig, GpuImageDecodeIsAutoOnOrOff) {
  const auto read = [](const std::string& v) {
    const auto c = parse_config("server:\n  gpu_image_decode: " + v + "\n", "s.yaml", {}, kNoEnv);
    EXPECT_EQ(c.gpu_image_decode.source, Source::file);
    EXPECT_EQ(c.gpu_image_decode.origin, "s.yaml:2:21");
    return c.gpu_image_decode.value;
  };
  EXPECT_EQ(read("true"), "on");  // YAML 1.1 booleans, as before
  EXPECT_EQ(read("false"), "off");
  EXPECT_EQ(read("on"), "on");
  EXPECT_EQ(read("off"), "off");
  EXPECT_EQ(read("auto"), "auto");
  EXPECT_EQ(read("AUTO"), "auto");
  EXPECT_EQ(read("yes"), "on");  // what as<bool> took before
  EXPECT_EQ(read("no"), "off");
  try {
    parse_config("server:\n  gpu_image_decode: sometimes\n", "s.yaml", {}, kNoEnv);
    FAIL() << "accepted 'sometimes'";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()),
              "s.yaml:2:21: server.gpu_image_decode must be auto, on or off, got 'sometimes'");
  }
}

TEST(ServerConfig, FileThenFlagsWithOrigins) {
  Overrides o;
  o.grpc_address = "127.0.0.1:9001";
  const auto c =
      parse_config("server:\n  grpc_address: 1.2.3.4:5\n  drain_seconds: 2.5\ndevice: cuda:1\n",
                   "s.yaml", o, {{"LIBREYOLO_KERNELS", "reference"}});
  EXPECT_EQ(c.grpc_address.value, "127.0.0.1:9001");
  EXPECT_EQ(c.grpc_address.origin, "--grpc-address");
  EXPECT_EQ(c.grpc_address.source, Source::flag);
  // LIBREYOLO_LOG_LEVEL wins over the file's log_level, as the daemon applies it.
  const auto logged =
      parse_config("server:\n  log_level: info\n", "l.yaml", {}, {{"LIBREYOLO_LOG_LEVEL", "warn"}});
  EXPECT_EQ(logged.log_level.value, "warn");
  EXPECT_EQ(logged.log_level.source, Source::environment);
  EXPECT_NE(describe(logged).find("  log_level: warn  # environment LIBREYOLO_LOG_LEVEL\n"),
            std::string::npos)
      << describe(logged);
  try {
    parse_config("", "l.yaml", {}, {{"LIBREYOLO_LOG_LEVEL", "loud"}});
    ADD_FAILURE() << "LIBREYOLO_LOG_LEVEL=loud accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "LIBREYOLO_LOG_LEVEL must be debug, info, warn, error or off, got 'loud'");
  }
  EXPECT_EQ(c.drain_seconds.value, 2.5);
  EXPECT_EQ(c.drain_seconds.origin, "s.yaml:3:18");
  EXPECT_EQ(c.device.value, "cuda:1");
  EXPECT_EQ(c.kernels.selection.value, "reference");
  const auto text = describe(c);
  std::cout << text;
  EXPECT_NE(text.find("  grpc_address: 127.0.0.1:9001  # flag --grpc-address\n"),
            std::string::npos);
  EXPECT_NE(text.find("  drain_seconds: 2.5  # s.yaml:3:18\n"), std::string::npos);
  EXPECT_NE(text.find("  http_address: 0.0.0.0:8000  # default\n"), std::string::npos);
  EXPECT_NE(text.find("LIBREYOLO_KERNELS"), std::string::npos);
}

TEST(ServerConfig, ErrorsNameFileLineAndColumn) {
  auto error = [](const std::string& yaml) {
    try {
      parse_config(yaml, "bad.yaml", {}, kNoEnv);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      error("server:\n  grpc_port: 1\n").rfind("bad.yaml:2:3: unknown key server.grpc_port", 0), 0u)
      << error("server:\n  grpc_port: 1\n");
  EXPECT_EQ(error("models: x\n").rfind("bad.yaml:1:1: unknown key models", 0), 0u);
  EXPECT_EQ(
      error("device: tpu\n").rfind("bad.yaml:1:9: device must be auto, cpu, cuda or cuda:N", 0),
      0u);
  EXPECT_EQ(error("server:\n  drain_seconds: soon\n")
                .rfind("bad.yaml:2:18: server.drain_seconds must be", 0),
            0u);
  EXPECT_EQ(error("kernels:\n  selction: auto\n").rfind("bad.yaml:2:3:", 0), 0u)
      << error("kernels:\n  selction: auto\n");
  EXPECT_EQ(error("server: [1, 2\n").rfind("bad.yaml:", 0), 0u);
  EXPECT_THROW(load_config("/nonexistent/server.yaml", {}, kNoEnv), ConfigError);
}

TEST(ServerConfig, ServingYaml) {
  const auto s = parse_serving_config("max_batch_size: 4\nthreshold: 0.25\ndtype: float16\n",
                                      "m/serving.yaml");
  EXPECT_EQ(s.max_batch_size, 4);
  EXPECT_EQ(s.threshold, 0.25);
  EXPECT_EQ(s.dtype, "float16");
  EXPECT_EQ(s.max_queue_size, 64u);
  try {
    parse_serving_config("max_batch: 4\n", "m/serving.yaml");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("m/serving.yaml:1:1: unknown key max_batch", 0), 0u)
        << e.what();
  }
  EXPECT_THROW(parse_serving_config("max_batch_size: 0\n", "x"), std::runtime_error);
}

// ---- the real binary ------------------------------------------------------------------------

std::string binary() { return std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-server"; }

/// Runs the binary with `args`, stdout (and stderr when `with_stderr`) to `out_file`; returns
/// the pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& out_file,
            bool with_stderr = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::freopen(out_file.c_str(), "w", stdout);
    (void)f;
    if (with_stderr) ::dup2(::fileno(stdout), 2);
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

TEST(ServerBinary, PrintConfig) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("print");
  write_file(dir / "s.yaml", "server:\n  drain_seconds: 3\n");
  const auto out = (dir / "out.txt").string();
  const pid_t pid = spawn(
      {"--config", (dir / "s.yaml").string(), "--http-address", "off", "--print-config"}, out);
  ASSERT_EQ(wait_exit(pid, 20), 0);
  const auto text = read_file(out);
  EXPECT_NE(text.find("  drain_seconds: 3  # " + (dir / "s.yaml").string() + ":2:18\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  http_address: off  # flag --http-address\n"), std::string::npos) << text;
  // --drain-seconds wins over the file (Triton's --exit-timeout-secs); a bad value exits 2
  // with its reason.
  ASSERT_EQ(wait_exit(spawn({"--config", (dir / "s.yaml").string(), "--http-address", "off",
                             "--drain-seconds", "0.5", "--print-config"},
                            out),
                      20),
            0);
  EXPECT_NE(read_file(out).find("  drain_seconds: 0.5  # flag --drain-seconds\n"),
            std::string::npos)
      << read_file(out);
  for (const char* bad : {"-1", "soon", "1e9", "nan", "", " 5", "0x10", "5s"}) {
    ASSERT_EQ(wait_exit(spawn({"--config", (dir / "s.yaml").string(), "--drain-seconds", bad,
                               "--print-config"},
                              out, true),
                        20),
              2)
        << bad;
    EXPECT_NE(read_file(out).find(
                  std::string("--drain-seconds must be between 0 and 86400, got '") + bad + "'"),
              std::string::npos)
        << read_file(out);
  }
  // Unknown keys: exit 2.
  write_file(dir / "bad.yaml", "sever:\n  drain_seconds: 3\n");
  EXPECT_EQ(wait_exit(spawn({"--config", (dir / "bad.yaml").string(), "--print-config"}, out), 20),
            2);
  remove_tree(dir);
}

TEST(ServerBinary, KernelsSubcommandRunsTheHubTool) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("kernels");
  const auto out = (dir / "out.txt").string();
  // No sub-command: the hub tool's usage, exit 2.
  ASSERT_EQ(wait_exit(spawn({"kernels"}, out, true), 20), 2);
  EXPECT_NE(read_file(out).find("usage: libreyolo-kernels-hub lock|download|verify"),
            std::string::npos)
      << read_file(out);
  // verify against a lock file that does not exist: a named error, exit 1, no request made.
  write_file(dir / "s.yaml", "kernels:\n  hub:\n    offline: true\n");
  ASSERT_EQ(
      wait_exit(spawn({"kernels", "verify", "--config", (dir / "s.yaml").string()}, out, true), 20),
      1);
  EXPECT_NE(read_file(out).find((dir / "kernels.lock").string() + ": cannot read the lock file"),
            std::string::npos)
      << read_file(out);
  remove_tree(dir);
}

TEST(ServerBinary, SigtermDrainsThenExitsZero) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("sigterm");
  const int port = free_port();
  write_file(dir / "s.yaml", "server:\n  drain_seconds: 1\n  http_address: \"off\"\ndevice: cpu\n");
  fs::create_directories(dir / "repo");  // no model: the drain does not depend on one
  const pid_t pid =
      spawn({"--config", (dir / "s.yaml").string(), "--model-repository", (dir / "repo").string(),
             "--grpc-address", "127.0.0.1:" + std::to_string(port)},
            (dir / "out.txt").string());
  ASSERT_TRUE(wait_port(port, 30)) << "the daemon never listened";
  rpc::Client c("127.0.0.1:" + std::to_string(port));
  const auto t0 = std::chrono::steady_clock::now();
  std::string state;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    state = c.health("readiness", 1.0).text;
    if (state == "SERVING") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(state, "SERVING");
  ::kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(c.health("readiness", 1.0).text, "NOT_SERVING");  // draining, still answering
  EXPECT_EQ(c.call("ServerLive", "", 1.0).text, "live: true\n");
  EXPECT_EQ(wait_exit(pid, 15), 0);
  remove_tree(dir);
}

/// The allocator this build linked, from its CMake cache: "tcmalloc" when LIBREYOLO_TCMALLOC is on
/// and found the library (CMakeLists.txt libreyolo_use_tcmalloc), else "glibc".
std::string linked_allocator() {
  const std::string cache = read_file(std::string(LIBREYOLO_BINARY_DIR) + "/CMakeCache.txt");
  const bool on = cache.find("\nLIBREYOLO_TCMALLOC:BOOL=ON\n") != std::string::npos;
  const auto at = cache.find("\nLIBREYOLO_TCMALLOC_LIBRARY:FILEPATH=");
  const bool found =
      at != std::string::npos && cache.compare(cache.find('\n', at + 1) - 9, 9, "-NOTFOUND") != 0;
  return on && found ? "tcmalloc" : "glibc";
}

/// The daemon says which malloc it runs (server/main.cpp): tcmalloc where the build linked it,
/// which is what its idle memory release calls too.
TEST(ServerBinary, LogsTheMemoryAllocatorItRuns) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("allocator");
  const int port = free_port();
  write_file(dir / "s.yaml", "server:\n  drain_seconds: 0\n  http_address: \"off\"\n");
  fs::create_directories(dir / "empty");
  const auto out = (dir / "out.txt").string();
  const pid_t pid =
      spawn({"--config", (dir / "s.yaml").string(), "--model-repository", (dir / "empty").string(),
             "--grpc-address", "127.0.0.1:" + std::to_string(port)},
            out, /*with_stderr=*/true);
  ASSERT_TRUE(wait_port(port, 30)) << "the daemon never listened";
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30) &&
         read_file(out).find("memory allocator: ") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid, 15), 0);
  const std::string expected = linked_allocator() == "tcmalloc"
                                   ? "[info] memory allocator: tcmalloc (gperftools)\n"
                                   : "[info] memory allocator: glibc malloc\n";
  EXPECT_NE(read_file(out).find(expected), std::string::npos) << read_file(out);
  remove_tree(dir);
}

/// Starts the daemon on an empty repository with `drain_seconds`, sends SIGINT twice `gap_ms`
/// apart once it is live, and returns its exit status (-1 when it never listened).
int exit_after_two_sigints(const std::string& name, const std::string& drain_seconds, int gap_ms) {
  const auto dir = temp_dir(name);
  const int port = free_port();
  write_file(dir / "s.yaml",
             "server:\n  drain_seconds: " + drain_seconds + "\n  http_address: \"off\"\n");
  fs::create_directories(dir / "empty");
  const pid_t pid =
      spawn({"--config", (dir / "s.yaml").string(), "--model-repository", (dir / "empty").string(),
             "--grpc-address", "127.0.0.1:" + std::to_string(port)},
            (dir / "out.txt").string());
  if (!wait_port(port, 30)) return -1;
  rpc::Client c("127.0.0.1:" + std::to_string(port));
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30) &&
         !c.call("ServerLive", "", 1.0).ok()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  ::kill(pid, SIGINT);
  const int status = wait_exit(pid, 10);
  remove_tree(dir);
  return status;
}

TEST(ServerBinary, SecondSignalExitsAtOnce) {
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  // More than 1 s after the first: a second request to stop, during a 30 s drain.
  EXPECT_EQ(exit_after_two_sigints("sigint", "30", 1300), 128 + SIGINT);
}

TEST(ServerBinary, SameSignalTwiceWithinASecondDrainsOnce) {
  // A terminal's Ctrl-C reaches the whole process group: a wrapper (scripts/run.sh, timeout)
  // forwarding it delivers SIGINT twice within microseconds. That is one stop request: drain,
  // exit 0 (128 + SIGINT if the second one aborted the drain). 100 ms apart, so that the kernel
  // does not merge the two pending signals into one.
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  EXPECT_EQ(exit_after_two_sigints("sigint2", "0.5", 100), 0);
}

}  // namespace
}  // namespace libreyolo::server

namespace libreyolo::server {
namespace {

TEST(ServerBinary, MissingModelRepositoryExitsOneNamingIt) {
  // Like Triton: a repository that is not there (a typo, a failed download) stops the start-up
  // instead of leaving a daemon that runs but is never ready.
  if (!fs::exists(binary())) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("norepo");
  write_file(dir / "s.yaml", "server:\n  http_address: \"off\"\n");
  const auto out = dir / "out.txt";
  const pid_t pid = spawn({"--config", (dir / "s.yaml").string(), "--model-repository",
                           (dir / "missing").string(), "--grpc-address", "127.0.0.1:0"},
                          out.string(), /*with_stderr=*/true);
  EXPECT_EQ(wait_exit(pid, 60), 1);
  const auto text = read_file(out);
  EXPECT_NE(text.find("start-up failed: model_repository " + (dir / "missing").string() +
                      " (flag --model-repository): not a directory"),
            std::string::npos)
      << text;
  remove_tree(dir);
}

}  // namespace
}  // namespace libreyolo::server
