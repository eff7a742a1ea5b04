// libreyolo-server: the daemon (DESIGN.md "Serving"). Signals: a SIGTERM/SIGINT during start-up
// (configuration, kernels, LibTorch and model loading: readiness never was SERVING) exits 0 at
// once; once serving, the first one flips readiness to NOT_SERVING, keeps serving for
// server.drain_seconds, then stops accepting and finishes in-flight requests (exit 0); a second
// signal exits at once (exit 128 + signal). The same signal again within 1 s of the first is the
// same request to stop: a terminal's Ctrl-C reaches the whole process group, so a wrapper that
// forwards it (scripts/run.sh, timeout(1)) delivers it twice.
//
// SIGHUP re-reads the TLS certificate files (server.tls) once serving; before, it is ignored.
//
// SIGINT/SIGTERM/SIGHUP are blocked in every thread from the first instruction of the process on
// (see block_stop_signals) and only one thread, Signals, takes them with sigwait: a signal sent
// while LibTorch or the models load is neither lost nor delivered to a library's thread.
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "log/log.h"
#include "server/app/daemon.h"
#include "server/config/config.h"

namespace {

using namespace libreyolo;

/// Prints the usage: to stdout and returns 0 for --help, to stderr for a usage error (code 2).
int usage(int code) {
  (code == 0 ? std::cout : std::cerr)
      << "usage: libreyolo-server [--config FILE] [--model-repository DIR] [--grpc-address "
         "HOST:PORT]\n"
         "                        [--http-address HOST:PORT|off] [--load-model NAME|*]...\n"
         "                        [--strict-readiness true|false] [--drain-seconds S]\n"
         "                        [--print-config]\n"
         "       libreyolo-server kernels lock|download|verify [...]   (hub kernels; "
         "docs/HUB_KERNELS.md)\n"
         "Default configuration file: config/server.yaml when it exists.\n";
  return code;
}

/// SIGINT, SIGTERM and SIGHUP: the signals the Signals thread takes.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

/// Blocks SIGINT/SIGTERM before anything else runs: an entry of the executable's
/// DT_PREINIT_ARRAY, which the dynamic loader runs before the initialisers of every shared
/// library (LibTorch, gRPC, OpenMP may start threads there; a thread inherits the mask of its
/// creator). Also resets an inherited SIG_IGN (a shell's background job ignores SIGINT): once
/// blocked, the signal stays pending for sigwait instead of being discarded. Only a signal sent
/// while the dynamic loader maps the libraries, before this runs, keeps its default action.
void block_stop_signals(int, char**, char**) {
  const sigset_t set = stop_signals();
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGHUP, SIG_DFL);
}

/// glibc malloc arenas for a daemon of many threads (gRPC handlers up to
/// server.max_concurrent_rpcs, the preprocessing pool, the instance workers). glibc gives threads
/// that contend for malloc up to 8 arenas per core, each keeping its own freed memory: on the
/// 2-core soak at concurrency 64 (docs/SOAK.md) 24 arena heaps held 700 MB and RSS plateaued ~230
/// MB higher than with 2 arenas at the same throughput; on a 64-core host the default allows 512.
/// Two arenas unless the operator chose (MALLOC_ARENA_MAX or GLIBC_TUNABLES, which glibc reads
/// itself). Runs from the pre-init array, before any library's initialiser starts a thread. A
/// build linked with tcmalloc (CMakeLists.txt LIBREYOLO_TCMALLOC) has no arenas: its mallopt
/// does nothing, and its per-thread caches are bounded by tcmalloc itself.
void limit_malloc_arenas(int, char**, char**) {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr || std::getenv("GLIBC_TUNABLES") != nullptr)
    return;
  mallopt(M_ARENA_MAX, 2);
}

__attribute__((section(".preinit_array"),
               used)) void (*const preinit_block_stop_signals)(int, char**,
                                                               char**) = &block_stop_signals;
__attribute__((section(".preinit_array"),
               used)) void (*const preinit_limit_malloc_arenas)(int, char**,
                                                                char**) = &limit_malloc_arenas;

/// The one thread that takes SIGINT/SIGTERM/SIGHUP (sigwait). SIGINT/SIGTERM before serving():
/// exit 0 at once (start-up: nothing was served, readiness never was SERVING). After serving():
/// the first one is handed to the main thread (the drain); any later one exits at once with
/// 128 + signal. SIGHUP after serving() runs the hang-up action (certificate reload), before it
/// is ignored.
class Signals {
 public:
  Signals() {
    std::thread([this] { run(); }).detach();  // lives until the process exits
  }

  /// Start-up is over (called before readiness is first published): from now on the first
  /// stop signal drains and SIGHUP runs `on_hangup`.
  void serving(std::function<void()> on_hangup) {
    std::lock_guard<std::mutex> lk(mu_);
    serving_ = true;
    on_hangup_ = std::move(on_hangup);
  }

  /// Waits for the first signal after serving() and returns it.
  int wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return first_ != 0; });
    return first_;
  }

 private:
  void run() {
    const sigset_t set = stop_signals();
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      std::unique_lock<std::mutex> lk(mu_);
      if (sig == SIGHUP) {
        if (!serving_ || !on_hangup_) {
          log::info("SIGHUP during start-up: ignored");
          continue;
        }
        const auto hangup = on_hangup_;
        lk.unlock();
        hangup();
        continue;
      }
      if (!serving_) {
        log::info("signal " + std::to_string(sig) +
                  " during start-up (readiness never was SERVING): exit 0");
        std::fflush(nullptr);
        std::_Exit(0);
      }
      if (first_ == 0) {
        first_ = sig;
        first_at_ = std::chrono::steady_clock::now();
        cv_.notify_all();
        continue;
      }
      if (sig == first_ && std::chrono::steady_clock::now() - first_at_ < std::chrono::seconds(1)) {
        log::info("signal " + std::to_string(sig) + " again within 1 s: the same stop request");
        continue;
      }
      log::warn("second signal " + std::to_string(sig) + ": exiting now");
      std::fflush(nullptr);
      std::_Exit(128 + sig);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false;
  std::function<void()> on_hangup_;
  int first_ = 0;
  std::chrono::steady_clock::time_point first_at_;
};

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
  // The hub tool is an ordinary command: Ctrl-C stops it (the mask survives execv).
  const sigset_t set = stop_signals();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  execv(path.c_str(), args.data());
  std::cerr << "libreyolo-server kernels: cannot run " << path << ": " << std::strerror(errno)
            << "\n";
  return 1;
}

/// Raises the soft open-files limit to the hard one. gRPC (Debian's 1.51) stops accepting for
/// good after one accept() fails with EMFILE: ~1,024 idle connections at the usual soft limit
/// left the gRPC port dead while HTTP still answered (found by breaking the daemon from
/// outside). The hard limit (1,048,576 in Kubernetes pods by default) makes that far costlier.
void raise_open_files_limit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur >= l.rlim_max) return;
  const rlim_t before = l.rlim_cur;
  l.rlim_cur = l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) == 0)
    log::info("start-up: open files limit raised from " + std::to_string(before) + " to " +
              std::to_string(l.rlim_cur));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "kernels") return exec_kernels_tool(argc, argv);
  // Already blocked since block_stop_signals (pre-init); again in case the executable was
  // linked without its pre-init array (e.g. into another program).
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Never destroyed: its thread may take a signal while static destructors run after main.
  Signals& stop = *new Signals;

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
    } else if (a == "--load-model") {
      overrides.load_models.push_back(value());
    } else if (a == "--strict-readiness") {
      const std::string v = value();
      if (v != "true" && v != "false") {
        std::cerr << "--strict-readiness must be true or false, got '" << v << "'\n";
        return usage(2);
      }
      overrides.strict_readiness = v == "true";
    } else if (a == "--drain-seconds") {
      // server.drain_seconds' range and message. Decimal digits, '.', 'e' and signs only
      // (strtod alone would take leading spaces, hex and "nan"), all of it consumed.
      const std::string v = value();
      char* end = nullptr;
      const bool decimal =
          !v.empty() && v.find_first_not_of("0123456789.eE+-") == std::string::npos;
      const double d = decimal ? std::strtod(v.c_str(), &end) : -1;
      if (!decimal || *end != '\0' || !(d >= 0 && d <= 86400)) {
        std::cerr << "--drain-seconds must be between 0 and 86400, got '" << v << "'\n";
        return usage(2);
      }
      overrides.drain_seconds = d;
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
    log::set_level(log::parse_level(config.log_level.value));  // LIBREYOLO_LOG_LEVEL included
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-server: " << e.what() << "\n";
    return 2;
  }
  log::info(
      "start-up: config " + (config_file.empty() ? std::string("(defaults)") : config_file) +
      " read in " +
      std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) +
      " s");

  raise_open_files_limit();
  const double drain = config.drain_seconds.value;
  server::Daemon daemon(std::move(config));
  try {
    daemon.start([&stop, &daemon] { stop.serving([&daemon] { daemon.reload_certificates(); }); });
  } catch (const std::exception& e) {
    log::error(std::string("start-up failed: ") + e.what());
    return 1;
  }
  // Freed memory back to the kernel once the daemon is idle: the allocator keeps what a load
  // freed (glibc's arenas held much of the RSS long after a load: docs/SOAK.md "After the
  // load"), so RSS only went up from run to run. Checked every 5 s; idle = the process used
  // under 5% of one core meanwhile, so a busy daemon never pays for the page faults that follow
  // a release. With tcmalloc (CMakeLists.txt LIBREYOLO_TCMALLOC) its
  // MallocExtension_ReleaseFreeMemory returns the free spans; found by name, so that a build
  // without it keeps glibc's malloc_trim(0), which releases the free pages of every arena.
  using ReleaseFn = void (*)();
  const auto tcmalloc_release =
      reinterpret_cast<ReleaseFn>(::dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
  log::info(std::string("memory allocator: ") +
            (tcmalloc_release ? "tcmalloc (gperftools)" : "glibc malloc"));
  std::thread([tcmalloc_release] {
    auto cpu_seconds = [] {
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
             1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    };
    constexpr double kPeriod = 5.0, kIdleShare = 0.05;
    double last = cpu_seconds();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPeriod));
      const double now = cpu_seconds();
      if (now - last < kIdleShare * kPeriod) {
        if (tcmalloc_release)
          tcmalloc_release();
        else
          malloc_trim(0);
      }
      last = now;
    }
  }).detach();
  const int sig = stop.wait();
  log::info("signal " + std::to_string(sig) + ": draining for " + std::to_string(drain) + " s");
  daemon.begin_drain();
  // A second signal exits at once (StopSignals), during the drain window and the stop alike.
  std::this_thread::sleep_for(std::chrono::duration<double>(drain));
  daemon.stop(30.0);
  log::info("exit 0");
  return 0;
}
