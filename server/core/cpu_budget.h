// How many CPUs this process may actually use: the affinity mask, capped by the cgroup CPU
// quota a container runtime sets (Kubernetes `resources.limits.cpu`, `docker run --cpus`).
// libgomp, and so ATen's default intra-op thread count, sizes its team from the affinity mask
// only: a pod limited to 2 CPUs on a 64-core node would run 64 threads and be throttled by the
// kernel's CFS bandwidth control for most of each period. The same rule as Go's
// uber-go/automaxprocs (internal/cgroups: floor(quota / period), at least 1), with the files of
// the JDK's container support (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us; the
// effective limit of a nested cgroup is the smallest along its path). Rounded down, not up as
// the JDK's processor count is: with 2.5 CPUs a third busy thread would be throttled for the
// last sixth of every period, and each OpenMP region waits at its barrier for the throttled
// thread. No torch.
#pragma once

#include <string>

namespace libreyolo::server {

/// Where the cgroup files are (tests point these at a temporary tree).
struct CgroupFiles {
  std::string proc_self_cgroup = "/proc/self/cgroup";  ///< "0::/path" (v2), "N:cpu,...:/path" (v1)
  std::string cgroup_root = "/sys/fs/cgroup";  ///< v2 unified mount; v1 controllers below it
};

/// The CPUs this process may use, and why.
struct CpuBudget {
  int cores = 1;       ///< >= 1
  int affinity = 1;    ///< CPUs in the affinity mask (sched_getaffinity), >= 1
  std::string source;  ///< e.g. "cgroup v2 /sys/fs/cgroup/cpu.max: 200000 100000", "affinity"
};

/// min(affinity_cpus, floor(quota / period) over every limited cgroup from the process's own up
/// to the root), at least 1. Unreadable, missing or unlimited ("max", -1) files mean no cap.
/// Never throws.
CpuBudget cpu_budget(const CgroupFiles& files, int affinity_cpus) noexcept;

/// cpu_budget() of this process: the real /proc and /sys files and sched_getaffinity (or
/// std::thread::hardware_concurrency when that fails). Never throws.
CpuBudget cpu_budget() noexcept;

}  // namespace libreyolo::server
