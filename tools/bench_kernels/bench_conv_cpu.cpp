// The CPU rows of conv2d_bias_act (issue 35): `winograd` (kernels/conv/cpu/
// conv2d_bias_act_winograd.cpp: F(4x4, 3x3) on channels_last maps) against `onednn` (oneDNN's
// direct convolution on a weight packed once, kernels/conv/cpu/conv2d_bias_act_onednn.cpp),
// float32, batch 1, at the 3x3 stride-1 convolutions of RT-DETR-R18 / R50 at 640x640 (the ResNet-vd
// stem, the backbone's stages and the encoder's RepVGG blocks) and D-FINE L's (HGNetV2's 48 / 96
// channels, the encoder's 128), with the activation they run with. Where `winograd` declines (too
// few channels: the 32 x 32 stem row) its row (path 1, bound alone) measures the portable path
// instead: at::conv2d, then bias and activation as ATen ops.
//
// Usage: OMP_NUM_THREADS=2 bench_conv_cpu --benchmark_repetitions=5
//   --benchmark_enable_random_interleaving=true (interleaved A/B on a shared machine).
// Arguments: C_in, C_out, side (H = W), act (0 none, 1 relu, 2 silu), path (0 onednn,
// 1 winograd). GFLOP/s counts a direct convolution's multiply-adds (2 C_in C_out 9 H W) for both.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "tools/bench_kernels/bench_cpu_main.h"

namespace {

using libreyolo::kernels::Activation;

void BM_Conv3x3Cpu(benchmark::State& state) {
  namespace k = libreyolo::kernels;
  const int64_t c_in = state.range(0), c_out = state.range(1), side = state.range(2);
  const auto act = static_cast<Activation>(state.range(3));
  const char* impl = state.range(4) == 1 ? "winograd" : "onednn";
  const at::InferenceMode guard;
  at::manual_seed(0);
  const auto x = at::randn({1, c_in, side, side}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = at::randn({c_out, c_in, 3, 3}) * 0.05, b = at::randn({c_out});
  k::BindContext c;
  c.model = "bench_conv_cpu";
  k::Filter only;
  only.allow[k::kConv2dBiasAct.name] = {impl};
  const auto h = k::Registry::process_default().bind(k::kConv2dBiasAct, c, &only);
  if (h.empty()) {
    state.SkipWithError("the implementation is not bound");
    return;
  }
  k::ConvGeometry g;
  g.pad_h = g.pad_w = 1;
  benchmark::DoNotOptimize(k::conv2d_bias_act(h, x, w, b, {}, g, act));  // packs the weight
  for (auto _ : state) benchmark::DoNotOptimize(k::conv2d_bias_act(h, x, w, b, {}, g, act));
  state.SetLabel(impl);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * c_in * c_out * 9 * side * side,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"Cin", "Cout", "side", "act", "path"});
  const int64_t relu = 1, silu = 2;
  const int64_t rows[][4] = {
      {32, 32, 320, relu},  {32, 64, 320, relu},  {64, 64, 160, relu},  {128, 128, 80, relu},
      {256, 256, 40, relu}, {512, 512, 20, relu}, {128, 128, 40, silu}, {256, 256, 80, silu},
      {48, 48, 160, relu},  {96, 96, 80, relu},   {128, 128, 20, silu}, {16, 16, 320, relu},
      {12, 12, 320, relu},  {8, 16, 320, relu},   {8, 8, 320, relu},
  };
  for (const auto& r : rows)
    for (int64_t path : {0, 1}) b->Args({r[0], r[1], r[2], r[3], path});
}

BENCHMARK(BM_Conv3x3Cpu)
    ->Apply(shapes)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", libreyolo::bench::least);

}  // namespace

int main(int argc, char** argv) { return libreyolo::bench::run_benchmarks(argc, argv); }
