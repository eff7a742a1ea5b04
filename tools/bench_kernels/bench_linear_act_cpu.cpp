// The CPU rows of the linear_act slot (issue 35): `onednn` (kernels/gemm/cpu/
// linear_act_onednn.cpp: oneDNN's inner product on a weight packed once, the activation as a
// post-op) against the portable path (at::linear, i.e. MKL's sgemm on the dense weight, then
// ATen's activation), float32, batch 1, at the shapes of RT-DETR-R18's and D-FINE L's Linears at
// 640x640: the encoder's FFN on the 20x20 map (400 tokens, 256 <-> 1024, GELU), the decoder's FFN
// and projections on 300 queries (ReLU / none), and the deformable attention's value projection
// on the whole pyramid (8400 tokens, 256 -> 256).
//
// Usage: OMP_NUM_THREADS=2 bench_linear_act_cpu --benchmark_repetitions=5
//   --benchmark_enable_random_interleaving=true (interleaved A/B on a shared machine).
// Arguments: tokens M, in K, out N, act (0 none, 1 relu, 3 gelu), path (0 at::linear, 1 onednn).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "kernels/gemm/linear_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "tools/bench_kernels/bench_cpu_main.h"

namespace {

using libreyolo::kernels::Activation;

void BM_LinearActCpu(benchmark::State& state) {
  namespace k = libreyolo::kernels;
  const int64_t m = state.range(0), in = state.range(1), out = state.range(2);
  const auto act = static_cast<Activation>(state.range(3));
  const bool onednn = state.range(4) == 1;
  const at::InferenceMode guard;
  at::manual_seed(0);
  const auto x = at::randn({1, m, in});
  const auto w = at::randn({out, in}) * 0.05, b = at::randn({out});
  k::BindContext c;
  c.model = "bench_linear_act_cpu";
  // The portable path: an empty handle.
  const auto h =
      onednn ? k::Registry::process_default().bind(k::kLinearAct, c) : k::LinearActHandle();
  if (onednn && h.empty()) {
    state.SkipWithError("onednn is not bound (LibTorch without oneDNN?)");
    return;
  }
  benchmark::DoNotOptimize(k::linear_act(h, x, w, b, act));  // packs the weight
  for (auto _ : state) benchmark::DoNotOptimize(k::linear_act(h, x, w, b, act));
  state.SetLabel(onednn ? "onednn" : "at::linear");
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * in * out, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "act", "path"});
  const int64_t none = 0, relu = 1, gelu = 3;
  const int64_t rows[][4] = {
      {400, 256, 1024, gelu}, {400, 1024, 256, none}, {400, 256, 256, none},
      {300, 256, 1024, relu}, {300, 1024, 256, none}, {300, 256, 256, none},
      {8400, 256, 256, none},
  };
  for (const auto& r : rows)
    for (int64_t path : {0, 1}) b->Args({r[0], r[1], r[2], r[3], path});
}

BENCHMARK(BM_LinearActCpu)
    ->Apply(shapes)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", libreyolo::bench::least);

}  // namespace

int main(int argc, char** argv) { return libreyolo::bench::run_benchmarks(argc, argv); }
