// The CPU budget (server/core/cpu_budget.h): cgroup v2 and v1 quota files in a temporary tree
// laid out as the kernel and container runtimes lay them out, and server.intra_op_threads.
#include "server/core/cpu_budget.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server_test_support.h"

namespace fs = std::filesystem;
using libreyolo::server::CgroupFiles;
using libreyolo::server::cpu_budget;
using libreyolo::server::CpuBudget;

namespace {

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("libreyolo-cgroup-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    libreyolo::server::testing::remove_tree(dir_);
    fs::create_directories(dir_ / "sys");
    files_.proc_self_cgroup = (dir_ / "cgroup").string();
    files_.cgroup_root = (dir_ / "sys").string();
  }
  void TearDown() override { libreyolo::server::testing::remove_tree(dir_); }

  /// Writes `text` to `path` below the fake /sys/fs/cgroup, making its folders.
  void write(const std::string& path, const std::string& text) {
    const fs::path p = dir_ / "sys" / path;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  void self(const std::string& text) { std::ofstream(files_.proc_self_cgroup) << text; }
  std::string root() const { return files_.cgroup_root; }

  fs::path dir_;
  CgroupFiles files_;
};

TEST_F(CgroupTree, V2TheSmallestQuotaAlongThePathWins) {
  self("0::/kubepods/pod1/c1\n");
  write("kubepods/cpu.max", "max 100000");
  write("kubepods/pod1/cpu.max", "250000 100000");
  write("kubepods/pod1/c1/cpu.max", "max 100000");
  const CpuBudget b = cpu_budget(files_, 8);
  EXPECT_EQ(b.cores, 2);  // floor(2.5)
  EXPECT_EQ(b.affinity, 8);
  EXPECT_EQ(b.source, "cgroup v2 " + root() + "/kubepods/pod1/cpu.max: 250000 100000");
  write("kubepods/pod1/c1/cpu.max", "150000 100000");
  EXPECT_EQ(cpu_budget(files_, 8).cores, 1);
  EXPECT_EQ(cpu_budget(files_, 8).source,
            "cgroup v2 " + root() + "/kubepods/pod1/c1/cpu.max: 150000 100000");
}

TEST_F(CgroupTree, V2InItsOwnNamespaceReadsTheRoot) {
  self("0::/\n");
  write("cpu.max", "200000 100000");
  EXPECT_EQ(cpu_budget(files_, 16).cores, 2);
  // A host path that does not exist in the container's view: the mount's own file.
  self("0::/system.slice/docker-abc.scope\n");
  EXPECT_EQ(cpu_budget(files_, 16).cores, 2);
  EXPECT_EQ(cpu_budget(files_, 16).source, "cgroup v2 " + root() + "/cpu.max: 200000 100000");
}

TEST_F(CgroupTree, NoQuotaOrAQuotaAboveTheAffinityKeepsTheAffinity) {
  self("0::/\n");
  write("cpu.max", "max 100000");
  CpuBudget b = cpu_budget(files_, 4);
  EXPECT_EQ(b.cores, 4);
  EXPECT_EQ(b.source, "affinity");
  write("cpu.max", "800000 100000");
  b = cpu_budget(files_, 2);
  EXPECT_EQ(b.cores, 2);
  EXPECT_EQ(b.source, "affinity");
  EXPECT_EQ(cpu_budget(files_, 0).cores, 1);  // never below one
}

TEST_F(CgroupTree, V1CfsQuota) {
  self("5:memory:/docker/abc\n12:cpu,cpuacct:/docker/abc\n");
  write("cpu,cpuacct/cpu.cfs_quota_us", "-1");
  write("cpu,cpuacct/cpu.cfs_period_us", "100000");
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "350000");
  write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  const CpuBudget b = cpu_budget(files_, 64);
  EXPECT_EQ(b.cores, 3);
  EXPECT_EQ(b.source,
            "cgroup v1 " + root() + "/cpu,cpuacct/docker/abc/cpu.cfs_quota_us: 350000 / 100000");
}

TEST_F(CgroupTree, JunkAndMissingFilesMeanNoCap) {
  EXPECT_EQ(cpu_budget(files_, 3).cores, 3);  // no /proc/self/cgroup at all
  self("0::/x\nnot a line\n7:cpu:\n");
  write("x/cpu.max", "abc def");
  EXPECT_EQ(cpu_budget(files_, 3).cores, 3);
  write("x/cpu.max", "0 100000");
  EXPECT_EQ(cpu_budget(files_, 3).cores, 3);
  self("0::../../etc\n");
  EXPECT_EQ(cpu_budget(files_, 3).cores, 3);
  self("0::relative\n");
  write("relative/cpu.max", "100000 100000");
  EXPECT_EQ(cpu_budget(files_, 3).source, "affinity");
}

TEST(IntraOpThreadsConfig, BoundedAndZeroMeansTheBudget) {
  using libreyolo::server::parse_config;
  const auto error = libreyolo::server::testing::config_error;
  EXPECT_EQ(error("server:\n  intra_op_threads: 2000\n"),
            "bad.yaml:2:21: server.intra_op_threads must be at most 1024");
  EXPECT_EQ(
      error("server:\n  intra_op_threads: -1\n"),
      "bad.yaml:2:21: server.intra_op_threads must be >= 0 (0: one per core of the CPU budget)");
  EXPECT_EQ(
      parse_config("server:\n  intra_op_threads: 3\n", "ok.yaml", {}, {}).intra_op_threads.value,
      3);
  EXPECT_EQ(parse_config("", "ok.yaml", {}, {}).intra_op_threads.value, 0);
}

/// The daemon applies the setting and reports the resolved threads in /active.
TEST(IntraOpThreadsConfig, TheDaemonAppliesItAndShowsItInActive) {
  using namespace libreyolo::server::testing;
  using libreyolo::server::Daemon;
  const auto repo = temp_dir("cpu-budget");
  Daemon d(loopback_config(repo, "cpu", "server:\n  intra_op_threads: 1\n"), fake_or_real());
  d.start();
  const auto active = nlohmann::json::parse(http_get(d.http_port(), "/active").body);
  const CpuBudget budget = cpu_budget();
  EXPECT_EQ(active["cpu"], (nlohmann::json{{"cores", budget.cores},
                                           {"affinity_cpus", budget.affinity},
                                           {"cores_source", budget.source},
                                           {"intra_op_threads", 1},
                                           {"intra_op_threads_source", "server.intra_op_threads"},
                                           {"preprocess_threads", 2}}))
      << active["cpu"].dump();
  EXPECT_EQ(active["server"]["intra_op_threads"],
            (nlohmann::json{{"value", 1}, {"source", "file"}, {"origin", "test.yaml:2:21"}}));
  d.stop(1.0);
  remove_tree(repo);
}

}  // namespace
