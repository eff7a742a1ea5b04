#include "server/core/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

namespace libreyolo::server {
namespace {

std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

/// floor(quota / period) when both are positive integers; nullopt for "max", -1 or junk.
std::optional<long long> whole_cpus(const std::string& quota, const std::string& period) {
  try {
    std::size_t a = 0, b = 0;
    const long long q = std::stoll(quota, &a), p = std::stoll(period, &b);
    if (a != quota.size() || b != period.size() || q <= 0 || p <= 0) return std::nullopt;
    return std::max(1LL, q / p);
  } catch (...) {
    return std::nullopt;
  }
}

/// `dir` and its parents down to `mount` (inclusive), the process's own cgroup first. A `path`
/// that does not exist below `mount` (a container without its own cgroup namespace sees the
/// host's path) leaves `mount` alone.
std::vector<std::string> path_to_root(const std::string& mount, std::string path) {
  std::vector<std::string> dirs;
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.find("..") != std::string::npos || (!path.empty() && path.front() != '/')) path.clear();
  for (;;) {
    dirs.push_back(mount + path);
    if (path.empty()) break;
    const auto slash = path.rfind('/');
    path.erase(slash == std::string::npos ? 0 : slash);
  }
  if (dirs.size() > 1 && !std::ifstream(dirs.front() + "/cgroup.procs") &&
      !std::ifstream(dirs.front() + "/cpu.max") &&
      !std::ifstream(dirs.front() + "/cpu.cfs_quota_us"))
    dirs = {mount};
  return dirs;
}

struct Cap {
  long long cpus = 0;
  std::string source;
};

void consider(std::optional<Cap>& best, long long cpus, const std::string& source) {
  if (!best || cpus < best->cpus) best = Cap{cpus, source};
}

}  // namespace

CpuBudget cpu_budget(const CgroupFiles& files, int affinity_cpus) noexcept {
  CpuBudget b;
  b.affinity = std::max(1, affinity_cpus);
  b.cores = b.affinity;
  b.source = "affinity";
  try {
    std::ifstream in(files.proc_self_cgroup);
    std::optional<Cap> cap;
    for (std::string line; std::getline(in, line);) {
      // hierarchy-ID:controller-list:cgroup-path (man 7 cgroups, /proc/pid/cgroup).
      const auto c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
      if (c2 == std::string::npos) continue;
      const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
      const std::string path = line.substr(c2 + 1);
      if (id == "0" && controllers.empty()) {
        for (const auto& dir : path_to_root(files.cgroup_root, path)) {
          const auto text = read_line(dir + "/cpu.max");  // "max 100000" or "200000 100000"
          if (!text) continue;
          std::istringstream fields(*text);
          std::string quota, period;
          fields >> quota >> period;
          if (const auto n = whole_cpus(quota, period))
            consider(cap, *n, "cgroup v2 " + dir + "/cpu.max: " + *text);
        }
        continue;
      }
      std::vector<std::string> names;
      std::istringstream list(controllers);
      for (std::string n; std::getline(list, n, ',');) names.push_back(n);
      if (std::find(names.begin(), names.end(), "cpu") == names.end()) continue;
      for (const std::string mount :
           {files.cgroup_root + "/" + controllers, files.cgroup_root + "/cpu"}) {
        if (!std::ifstream(mount + "/cpu.cfs_period_us")) continue;
        for (const auto& dir : path_to_root(mount, path)) {
          const auto quota = read_line(dir + "/cpu.cfs_quota_us");
          const auto period = read_line(dir + "/cpu.cfs_period_us");
          if (!quota || !period) continue;
          if (const auto n = whole_cpus(*quota, *period))
            consider(cap, *n,
                     "cgroup v1 " + dir + "/cpu.cfs_quota_us: " + *quota + " / " + *period);
        }
        break;
      }
    }
    if (cap && cap->cpus < b.affinity) {
      b.cores = static_cast<int>(cap->cpus);
      b.source = cap->source;
    }
  } catch (...) {
    // Unreadable files: the affinity mask stands.
  }
  return b;
}

CpuBudget cpu_budget() noexcept {
  int affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = CPU_COUNT(&set);
  if (affinity < 1) affinity = static_cast<int>(std::thread::hardware_concurrency());
  return cpu_budget(CgroupFiles{}, affinity);
}

}  // namespace libreyolo::server
