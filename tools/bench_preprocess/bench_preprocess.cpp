// What the daemon's preprocessing pool does per JPEG input (server/core/infer_pipeline.cpp):
// decode (models/image/decode.cpp) + the checkpoint's image processor (models/image/processor.cpp)
// to (1, 3, 640, 640) float32, run by P threads at once (Google Benchmark ->Threads(P)), in two
// modes:
//   share:0  ATen's default: every thread's resize and normalise fork an OpenMP team of all cores
//   share:1  each thread limited to max(1, cores / P) intra-op threads, as the daemon's pool is
//            (models::use_intra_op_threads, called by server/core/core.cpp on each pool thread)
// items_per_second is images per second over all P threads (wall clock).
// BM_PostProcess: the other end of a request, the detections of one image from its RT-DETR
// outputs (image::post_process_object_detection, what the detector task's answer runs on a request
// thread, with one intra-op thread as there): logits (1, 300, 80) of a confident detector
// (N(-6, 1.5), 20 planted scores above 0.5), threshold 0.5 (the selection above the threshold)
// or 0 (every score above it: the full top-k of 24,000 that every request ran before, after this
// path's scan finds too many candidates).
//
// Usage: bench_preprocess [--benchmark_filter=...] [--benchmark_min_time=2s]
//   IMAGE (default tests/fixtures/images/astronaut.jpg, 512x512), PROCESSOR (a checkpoint folder
//   with preprocessor_config.json; default tests/fixtures/models/rtdetr_tiny: RTDetrImageProcessor
//   at 640x640).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "models/image/decode.h"
#include "models/image/postprocess.h"
#include "models/image/processor.h"
#include "models/runtime/intra_op_threads.h"

namespace {

namespace image = libreyolo::image;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Inputs {
  std::vector<std::uint8_t> jpeg;
  std::unique_ptr<image::ImageProcessor> processor;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs x;
    const std::string root = LIBREYOLO_SOURCE_DIR;
    std::ifstream f(env_or("IMAGE", root + "/tests/fixtures/images/astronaut.jpg"),
                    std::ios::binary);
    x.jpeg.assign(std::istreambuf_iterator<char>(f), {});
    x.processor = image::load_image_processor(
        env_or("PROCESSOR", root + "/tests/fixtures/models/rtdetr_tiny"));
    return x;
  }();
  return in;
}

void BM_DecodePreprocess(benchmark::State& state) {
  const Inputs& in = inputs();
  if (in.jpeg.empty()) {
    state.SkipWithError("IMAGE is empty or unreadable");
    return;
  }
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (state.range(0) == 1 &&
      !libreyolo::models::use_intra_op_threads(std::max(1, cores / state.threads()))) {
    state.SkipWithError("the intra-op limit did not hold (ATen's backend is not OpenMP)");
    return;
  }
  at::InferenceMode guard;
  for (auto _ : state) {
    const at::Tensor img = image::decode_image(in.jpeg.data(), in.jpeg.size());
    auto out = in.processor->preprocess({img});
    benchmark::DoNotOptimize(out.pixel_values.data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["intra_op_threads"] =
      benchmark::Counter(at::get_num_threads(), benchmark::Counter::kAvgThreads);
}

void thread_counts(benchmark::internal::Benchmark* b) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  b->Arg(0)->Arg(1);  // every Arg runs at every thread count
  for (int p = 1; p <= cores; p *= 2) b->Threads(p);
  if ((cores & (cores - 1)) != 0) b->Threads(cores);
}

BENCHMARK(BM_DecodePreprocess)
    ->ArgName("share")
    ->Apply(thread_counts)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_PostProcess(benchmark::State& state) {
  at::InferenceMode guard;
  const int threads = at::get_num_threads();
  if (!libreyolo::models::use_intra_op_threads(1)) {
    state.SkipWithError("the intra-op limit did not hold (ATen's backend is not OpenMP)");
    return;
  }
  at::manual_seed(0);
  at::Tensor logits = at::randn({1, 300, 80}) * 1.5 - 6;
  for (int64_t j = 0; j < 20; ++j) logits[0][j * 7][j % 80] = 1.0 + 0.1 * static_cast<double>(j);
  const at::Tensor boxes = at::rand({1, 300, 4});
  image::PostProcessOptions options;
  options.threshold = state.range(0) == 0 ? 0.0 : 0.5;
  int64_t kept = 0;
  for (auto _ : state) {
    auto d = image::post_process_object_detection(logits, boxes, {{480, 640}},
                                                  image::DetectionHead::rt_detr, options);
    kept = d.front().scores.size(0);
    benchmark::DoNotOptimize(d.front().boxes.data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["kept"] = static_cast<double>(kept);
  libreyolo::models::use_intra_op_threads(threads);
}

BENCHMARK(BM_PostProcess)->ArgName("threshold_half")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
