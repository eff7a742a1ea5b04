// What the CPU Google Benchmark drivers (bench_linear_act_cpu, bench_conv_cpu) share: the least
// repetition as a statistic and main().
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "kernels/registry.h"

namespace libreyolo::bench {

/// The least repetition beside the median: on a shared machine the least is the one least
/// disturbed by other processes.
inline double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

/// main(): resolves the process registry, then runs the registered benchmarks.
inline int run_benchmarks(int argc, char** argv) {
  libreyolo::kernels::Registry::process_default().resolve();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace libreyolo::bench
