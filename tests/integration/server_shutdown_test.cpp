// SIGTERM against the real libreyolo-server binary (a child process) with 32 ModelInfer calls in
// flight on the tiny RT-DETR: readiness turns NOT_SERVING at once, requests are still accepted
// during drain_seconds, every in-flight request completes OK, calls after the drain window are
// refused (UNAVAILABLE) and the process exits 0 within drain_seconds + grace. A signal during
// start-up (the process barely started, or a model still loading) exits 0 at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;
using SteadyClock = std::chrono::steady_clock;

std::string binary() { return std::string(LIBREYOLO_BINARY_DIR) + "/bin/libreyolo-server"; }

double since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

/// Starts the binary with `args`, stdout and stderr to `log_file`; returns the pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& log_file) {
  // The child would write the parent's unflushed output a second time (freopen flushes).
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::freopen(log_file.c_str(), "w", stdout);
    (void)f;
    ::dup2(::fileno(stdout), 2);
    std::vector<std::string> copy = args;
    std::string b = binary();
    std::vector<char*> argv{b.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("LIBREYOLO_HUB_KERNELS", "0", 1);
    ::execv(b.c_str(), argv.data());
    std::_Exit(127);
  }
  return pid;
}

/// Exit code (negative signal number when killed); -1000 (after SIGKILL) past `timeout_s`.
int wait_exit(pid_t pid, double timeout_s) {
  const auto end = SteadyClock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (SteadyClock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1000;
}

/// SigBlk of /proc/<pid>/status (the main thread's blocked signals), 0 when unreadable.
unsigned long long blocked_signals(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

/// A signal sent as early as the process can take it: the moment SIGINT/SIGTERM are blocked
/// (the executable's pre-init, before LibTorch's initialisers run) it is pending, and the
/// signal thread exits 0 before anything is served.
TEST(ServerShutdown, SignalRightAfterLaunchExitsZero) {
  if (::access(binary().c_str(), X_OK) != 0) GTEST_SKIP() << binary() << " not built";
  for (const int sig : {SIGINT, SIGTERM}) {
    const auto dir = temp_dir("early-signal");
    add_rtdetr_tiny(dir / "repo");
    write_file(dir / "server.yaml",
               "server:\n  grpc_address: 127.0.0.1:" + std::to_string(free_port()) +
                   "\n  http_address: \"off\"\nmodel_repository: " + (dir / "repo").string() +
                   "\ndevice: cpu\n");
    const std::string log_file = (dir / "server.log").string();
    const auto t0 = SteadyClock::now();
    const pid_t pid = spawn({"--config", (dir / "server.yaml").string()}, log_file);
    ASSERT_GT(pid, 0);
    const unsigned long long want = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
    while ((blocked_signals(pid) & want) != want && since(t0) < 20) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double blocked_at = since(t0);
    ASSERT_EQ(blocked_signals(pid) & want, want) << "SIGINT/SIGTERM never blocked";
    ASSERT_EQ(::kill(pid, sig), 0);
    const int code = wait_exit(pid, 20.0);
    const auto log = read_file(log_file);
    std::cout << "signal " << sig << " at " << blocked_at << " s after the launch (blocked): exit "
              << code << " at " << since(t0) << " s\n";
    EXPECT_EQ(code, 0) << log;
    EXPECT_NE(log.find("signal " + std::to_string(sig) +
                       " during start-up (readiness never was SERVING): exit 0"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("ready after"), std::string::npos) << log;
    remove_tree(dir);
  }
}

/// SIGTERM while a model is still loading: its config.json is a FIFO nobody writes, so the
/// load never ends (a slow disk or a huge checkpoint, forever). The daemon listens, is live and
/// not ready; the signal exits 0 at once. (It used to be taken only once every model had
/// loaded: never, here.)
TEST(ServerShutdown, SigtermWhileAModelLoadsExitsZero) {
  if (::access(binary().c_str(), X_OK) != 0) GTEST_SKIP() << binary() << " not built";
  const auto dir = temp_dir("loading-signal");
  add_rtdetr_tiny(dir / "repo", "warmup: false\n");
  fs::create_directories(dir / "repo" / "stuck" / "1");
  ASSERT_EQ(::mkfifo((dir / "repo" / "stuck" / "1" / "config.json").c_str(), 0600), 0);
  const int port = free_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  write_file(dir / "server.yaml", "server:\n  grpc_address: " + address +
                                      "\n  http_address: \"off\"\n  drain_seconds: 30\n"
                                      "model_repository: " +
                                      (dir / "repo").string() + "\ndevice: cpu\n");
  const std::string log_file = (dir / "server.log").string();
  const pid_t pid = spawn({"--config", (dir / "server.yaml").string()}, log_file);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_port(port, 30)) << read_file(log_file);
  rpc::Client c(address);
  // rtdetr_tiny loads; stuck never does: live, not ready.
  const auto t0 = SteadyClock::now();
  while (read_file(log_file).find("model 'rtdetr_tiny' version 1 ready") == std::string::npos &&
         since(t0) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(c.health("liveness", 1.0).text, "SERVING");
  EXPECT_EQ(c.health("readiness", 1.0).text, "NOT_SERVING");
  const auto t_signal = SteadyClock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int code = wait_exit(pid, 10.0);
  const auto log = read_file(log_file);
  std::cout << "SIGTERM while a model loads: exit " << code << " after " << since(t_signal)
            << " s\n";
  EXPECT_EQ(code, 0) << log;
  EXPECT_LT(since(t_signal), 5.0);
  EXPECT_NE(log.find("signal 15 during start-up (readiness never was SERVING): exit 0"),
            std::string::npos)
      << log;
  remove_tree(dir);
}

TEST(ServerShutdown, SigtermWith32InFlightDrainsCompletesAllAndExitsZero) {
  if (::access(binary().c_str(), X_OK) != 0) GTEST_SKIP() << binary() << " not built";
  const double drain_seconds = 1.0;
  const auto dir = temp_dir("shutdown");
  const int port = free_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // One image per forward: the 32 requests queue and run one after another (over a second on
  // CPU), so that many are still queued or running when the signal arrives and when the drain
  // window closes.
  // No warm-up: the first forward (1-2 s on CPU) is paid by the requests in flight instead.
  add_rtdetr_tiny(dir / "repo", "max_batch_size: 1\nmax_queue_size: 64\nwarmup: false\n");
  write_file(dir / "server.yaml",
             "server:\n  grpc_address: " + address +
                 "\n  http_address: \"off\"\n  drain_seconds: " + std::to_string(drain_seconds) +
                 "\n  preprocess_threads: 2\nmodel_repository: " + (dir / "repo").string() +
                 "\ndevice: cpu\n");
  const std::string log_file = (dir / "server.log").string();
  const pid_t pid = spawn({"--config", (dir / "server.yaml").string()}, log_file);
  ASSERT_GT(pid, 0);

  rpc::Client c(address);
  const auto t_start = SteadyClock::now();
  std::string state;
  while (since(t_start) < 30) {
    state = c.health("readiness", 1.0).text;
    if (state == "SERVING") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(state, "SERVING") << read_file(log_file);
  std::cout << "ready after " << since(t_start) << " s\n";

  const std::string request =
      "model_name: \"rtdetr_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: 1 } "
      "parameters { key: \"threshold\" value { double_param: 0.0 } } "
      "parameters { key: \"top_k\" value { int64_param: 5 } }";
  const std::vector<std::string> raw = {
      rpc::pack_bytes({read_file(std::string(LIBREYOLO_TEST_FIXTURES) + "/images/coffee.jpg")})};

  // 32 calls on the wire, each waited for by its own thread (completion time recorded).
  const int n = 32;
  std::vector<std::unique_ptr<rpc::PendingInfer>> calls;
  for (int i = 0; i < n; ++i) calls.push_back(c.start_infer(request, raw, 30.0));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // received and queued
  const auto t_signal = SteadyClock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  std::vector<rpc::InferResult> results(n);
  std::vector<double> done_at(n);
  std::vector<std::thread> waiters;
  for (int i = 0; i < n; ++i) {
    waiters.emplace_back([&, i] {
      results[i] = calls[i]->wait();
      done_at[i] = since(t_signal);
    });
  }

  // Draining: NOT_SERVING at once, still alive and still accepting requests.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto during = c.start_infer(request, raw, 30.0);
  const double during_sent = since(t_signal);
  EXPECT_EQ(c.health("readiness", 1.0).text, "NOT_SERVING");
  EXPECT_EQ(c.health("", 1.0).text, "NOT_SERVING");
  EXPECT_EQ(c.health("liveness", 1.0).text, "SERVING");
  EXPECT_EQ(c.call("ServerReady", "", 1.0).text, "");  // ready: false

  // After the drain window: new calls are refused.
  std::this_thread::sleep_for(std::chrono::duration<double>(drain_seconds + 0.3 - since(t_signal)));
  const double late_sent = since(t_signal);
  const auto late = c.infer(request, raw, 2.0);
  // Never served. While calls are still in flight the service refuses it UNAVAILABLE "the server
  // is shutting down" (asserted deterministically, with a held forward, by
  // ServerLifecycle.CallsDuringTheStopAreUnavailable); once they are done gRPC shuts down and the
  // port refuses the connection. A call that reaches gRPC's Shutdown on a connection still open
  // (its GOAWAY on the way) is CANCELLED by gRPC itself (Server::CallData::KillZombie in
  // src/core/lib/surface/server.cc, gRPC 1.51): which of the three this call meets depends on
  // when the last of the 32 finished, so all three are accepted here, and nothing else.
  const bool refused_by_us =
      late.code == Code::unavailable && late.message == "the server is shutting down";
  const bool refused_by_port = late.code == Code::unavailable &&
                               late.message.find("Connection refused") != std::string::npos;
  const bool cancelled_by_grpc = late.code == Code::cancelled && late.message == "CANCELLED";
  EXPECT_TRUE(refused_by_us || refused_by_port || cancelled_by_grpc)
      << api::code_name(late.code) << " " << late.message;

  for (auto& t : waiters) t.join();
  const auto d = during->wait();
  // (an upper bound of when the drain-window request ended: it is waited for after the 32)
  const double during_done = since(t_signal);
  // The daemon's grace for in-flight calls is 30 s (server/main.cpp): on a loaded 2-core machine
  // the 32 CPU forwards alone can take 10 s, so the exit is bounded by the last completion, not
  // by the clock (CI failed the old `drain + 10 s` bound once).
  const int code = wait_exit(pid, drain_seconds + 30.0 + 5.0);
  const double exit_s = since(t_signal);

  int ok = 0, after_signal = 0, after_drain = 0;
  for (int i = 0; i < n; ++i) {
    const auto& r = results[i];
    EXPECT_TRUE(r.ok()) << "request " << i << ": " << api::code_name(r.code) << " " << r.message;
    if (!r.ok()) continue;
    ++ok;
    after_signal += done_at[i] > 0;
    after_drain += done_at[i] > drain_seconds;
    // The same photograph every time: the same detections.
    ASSERT_EQ(r.outputs.size(), results[0].outputs.size());
    for (std::size_t k = 0; k < r.outputs.size(); ++k) {
      EXPECT_EQ(r.outputs[k].data, results[0].outputs[k].data) << r.outputs[k].name;
    }
    EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{5});
  }
  const double last = *std::max_element(done_at.begin(), done_at.end());
  std::cout << "SIGTERM with " << n << " in flight: OK " << ok << ", completed after the signal "
            << after_signal << ", after the drain window (" << drain_seconds << " s) "
            << after_drain << ", last at " << last << " s; request sent during the drain at "
            << during_sent << " s: " << api::code_name(d.code) << "; request at " << late_sent
            << " s: " << api::code_name(late.code) << " (" << late.message << "); exit " << code
            << " at " << exit_s << " s\n";
  EXPECT_EQ(ok, n);
  EXPECT_GE(after_signal, 1) << "no request was in flight when SIGTERM arrived";
  EXPECT_TRUE(d.ok()) << "a request during the drain window: " << api::code_name(d.code) << " "
                      << d.message;
  EXPECT_EQ(code, 0) << read_file(log_file);
  // The last call to end may be the one sent during the drain window, queued behind the 32.
  // The bound tells a daemon that waits out its 30 s grace from one that exits once the calls
  // are done; 10 s of slack, since under ctest -j2 on 2 cores the teardown after the last call
  // (gRPC's shutdown, the models' unload, the process's exit) once took 5.3 s.
  EXPECT_LT(exit_s, std::max({last, during_done, drain_seconds}) + 10.0)
      << "exit long after the last call ended (the drain-window call ended by " << during_done
      << " s)\n"
      << read_file(log_file);
  const auto log = read_file(log_file);
  EXPECT_NE(log.find("signal 15: draining for 1"), std::string::npos) << log;
  EXPECT_NE(log.find("exit 0"), std::string::npos) << log;
  remove_tree(dir);
}

}  // namespace
}  // namespace libreyolo::server
