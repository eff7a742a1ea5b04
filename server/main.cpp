// libreyolo-server: the daemon (DESIGN.md "Serving"). Signals: the first SIGTERM/SIGINT flips
// readiness to NOT_SERVING, keeps serving for server.drain_seconds, then stops accepting and
// finishes in-flight requests (exit 0); a second signal exits at once (exit 128 + signal).
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "log/log.h"
#include "server/core/config.h"
#include "server/core/daemon.h"

namespace {

using namespace libreyolo;

int usage(int code) {
  std::cerr << "usage: libreyolo-server [--config FILE] [--model-repository DIR] [--grpc-address "
               "HOST:PORT]\n"
               "                        [--http-address HOST:PORT|off] [--print-config]\n"
               "       libreyolo-server kernels lock|download|verify [...]   (hub kernels; "
               "docs/HUB_KERNELS.md)\n"
               "Default configuration file: config/server.yaml when it exists.\n";
  return code;
}

/// Waits up to `seconds` for SIGTERM/SIGINT (blocked in every thread); returns it or 0.
int wait_signal(const sigset_t& set, double seconds) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

/// `libreyolo-server kernels ...` is `libreyolo-kernels-hub ...` (the program installed next to
/// this one), so that init containers and operators need one program name. Returns only on error.
int exec_kernels_tool(int argc, char** argv) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::cerr << "libreyolo-server kernels: cannot locate this program\n";
    return 1;
  }
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "libreyolo-kernels-hub";
  std::vector<char*> args{path.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(path.c_str(), args.data());
  std::cerr << "libreyolo-server kernels: cannot run " << path << ": " << std::strerror(errno)
            << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "kernels") return exec_kernels_tool(argc, argv);
  // Block the signals before any thread starts, so that only sigtimedwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string config_file;
  bool config_given = false, print = false;
  server::Overrides overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(usage(2));
      }
      return argv[++i];
    };
    if (a == "--config") {
      config_file = value();
      config_given = true;
    } else if (a == "--model-repository") {
      overrides.model_repository = value();
    } else if (a == "--grpc-address") {
      overrides.grpc_address = value();
    } else if (a == "--http-address") {
      overrides.http_address = value();
    } else if (a == "--print-config") {
      print = true;
    } else if (a == "--help" || a == "-h") {
      return usage(0);
    } else {
      std::cerr << "unknown argument " << a << "\n";
      return usage(2);
    }
  }
  if (!config_given && std::filesystem::exists("config/server.yaml"))
    config_file = "config/server.yaml";

  const auto t0 = std::chrono::steady_clock::now();
  server::ServerConfig config;
  try {
    config = server::load_config(config_file, overrides, kernels::process_environment());
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-server: " << e.what() << "\n";
    return 2;
  }
  if (print) {
    std::cout << server::describe(config);
    return 0;
  }
  try {
    const char* env_level = std::getenv("LIBREYOLO_LOG_LEVEL");
    log::set_level(log::parse_level(env_level && *env_level ? env_level : config.log_level.value));
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-server: " << e.what() << "\n";
    return 2;
  }
  log::info(
      "start-up: config " + (config_file.empty() ? std::string("(defaults)") : config_file) +
      " read in " +
      std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) +
      " s");

  const double drain = config.drain_seconds.value;
  server::Daemon daemon(std::move(config));
  try {
    daemon.start();
  } catch (const std::exception& e) {
    log::error(std::string("start-up failed: ") + e.what());
    return 1;
  }
  int sig = 0;
  while ((sig = wait_signal(signals, 3600.0)) == 0) {
  }
  log::info("signal " + std::to_string(sig) + ": draining for " + std::to_string(drain) + " s");
  daemon.begin_drain();
  if (int again = wait_signal(signals, drain)) {
    log::warn("second signal " + std::to_string(again) + ": exiting now");
    std::_Exit(128 + again);
  }
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    daemon.stop(30.0);
    done = true;
  });
  while (!done) {
    if (int again = wait_signal(signals, 0.1)) {
      log::warn("second signal " + std::to_string(again) + ": exiting now");
      std::_Exit(128 + again);
    }
  }
  stopper.join();
  log::info("exit 0");
  return 0;
}
