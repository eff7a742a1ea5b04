// bench_preprocess's GPU rows (issue 32): a batch of B JPEGs decoded by the `image_decode_batch`
// slot's nvjpeg (nvjpegDecodeBatched, the hardware backend; models/image/decode_slot.h
// decode_images, as the server decodes a request's images), then resized to 640x640 (bilinear,
// antialiased), rescaled and normalised (ImageNet mean/std) into one (B, 3, 640, 640) bfloat16
// batch:
//   BM_GpuDecodePreprocess       by the image processor's ATen ops on the GPU, then .to(bf16);
//   BM_GpuDecodePreprocessSlot   by the `image_preprocess` slot's `cuda` kernel straight into a
//                                reused bf16 batch buffer (models/image/preprocess_slot.h);
//   BM_GpuPreprocess/path:0|1    the preprocessing alone (0: ATen ops, 1: the slot) on B images
//                                decoded once before the loop.
// items_per_second is images per second timed by CUDA events around each batch (decode start,
// or preprocess start, to the bf16 batch written), B = 32 and 128, one host thread.
//
// The files: every *.jpg of $JPEG_DIR (sorted), cycled through; scripts/bench-decode-gpu.sh
// makes them (tools/bench_preprocess/decode_anchor.py --make: 640x480 4:2:0 baseline JPEGs of
// the fixture photographs at several qualities) and runs torchvision's decode + v2 transforms on
// the same files in the same call (decode_anchor.py). Images nvjpeg declines are decoded by the
// reference and moved to the GPU (counted in the `declined` counter); `slot_declined` counts
// batches the slot left to the ATen ops.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <benchmark/benchmark.h>
#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/image_preprocess.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"
#include "models/image/decode.h"
#include "models/image/decode_slot.h"
#include "models/image/preprocess_slot.h"
#include "models/image/processor.h"

namespace {

namespace image = libreyolo::image;
namespace kernels = libreyolo::kernels;

struct GpuInputs {
  std::vector<std::vector<uint8_t>> files;
  std::string error;  ///< why the row cannot run ("" when it can)
  kernels::Registry registry;
  kernels::ImageDecodeHandle single;
  kernels::ImageDecodeBatchHandle batch;
  kernels::ImagePreprocessHandle preprocess;
  std::unique_ptr<image::ImageProcessor> processor;
};

GpuInputs& gpu_inputs() {
  static GpuInputs* in = [] {
    auto* x = new GpuInputs();  // never destroyed: nvJPEG's objects live for the process
    const char* dir = std::getenv("JPEG_DIR");
    if (!dir || !*dir) {
      x->error = "JPEG_DIR is not set (scripts/bench-decode-gpu.sh makes the files)";
      return x;
    }
    std::vector<std::string> names;
    if (DIR* d = opendir(dir)) {
      while (const dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n.size() > 4 && n.compare(n.size() - 4, 4, ".jpg") == 0) names.push_back(n);
      }
      closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names)
      x->files.push_back(image::read_file_bytes(std::string(dir) + "/" + n));
    if (x->files.empty()) {
      x->error = std::string("no .jpg files in ") + dir;
      return x;
    }
    if (!at::cuda::is_available()) {
      x->error = "no CUDA device";
      return x;
    }
    kernels::register_builtin_slots(x->registry);
    image::register_image_decode_reference(x->registry);
    if (auto p = kernels::make_nvjpeg_provider()) x->registry.add_provider(p);
    if (auto p = kernels::make_cuda_provider()) x->registry.add_provider(p);
    x->registry.resolve();
    kernels::BindContext ctx;
    ctx.device = kernels::BindContext::Device::cuda;
    ctx.device_index = 0;
    ctx.model = "bench";
    x->single = x->registry.bind(kernels::kImageDecode, ctx);
    x->batch = x->registry.bind(kernels::kImageDecodeBatch, ctx);
    ctx.dtype = "bfloat16";
    x->preprocess = x->registry.bind(kernels::kImagePreprocess, ctx);
    for (const auto& p : x->registry.providers())
      if (p.name == "nvjpeg" && p.state != "loaded")
        x->error = "nvjpeg " + p.state + ": " + p.detail;
    // What decode_anchor.py runs: Resize((640, 640)) antialiased bilinear, ToDtype(float32,
    // scale=True), Normalize(ImageNet mean/std).
    x->processor = std::make_unique<image::ImageProcessor>(image::ProcessorConfig::from_json(
        R"({"image_processor_type": "RTDetrImageProcessor", "size": {"height": 640, "width": 640},
            "do_normalize": true, "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225]})",
        "bench_preprocess_gpu"));
    return x;
  }();
  return *in;
}

/// B files decoded onto the GPU (the next ones of the cycle), as the server decodes a request's
/// images; `declined` counts those the reference decoded on the CPU.
std::vector<at::Tensor> decode_next(GpuInputs& in, std::size_t b, std::size_t& next,
                                    std::int64_t& declined) {
  std::vector<kernels::EncodedImage> encoded;
  for (std::size_t i = 0; i < b; ++i, next = (next + 1) % in.files.size())
    encoded.push_back({in.files[next].data(), in.files[next].size()});
  auto decoded = image::decode_images(in.batch, in.single, encoded, {}, /*device_index=*/0);
  std::vector<at::Tensor> pixels;
  for (auto& d : decoded) {
    if (!d.error.empty()) throw std::runtime_error(d.error);
    if (!d.pixels.is_cuda()) ++declined;
    pixels.push_back(d.pixels.to(at::kCUDA, /*non_blocking=*/false));
  }
  return pixels;
}

/// Times `one_batch` (returns the bf16 batch) with CUDA events after 3 warm-up calls (nvJPEG's
/// buffers, the caching allocator).
template <class F>
void time_batches(benchmark::State& state, F&& one_batch) {
  for (int i = 0; i < 3; ++i) one_batch();
  for (auto _ : state) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    const at::Tensor out = one_batch();
    stop.record();
    stop.synchronize();
    benchmark::DoNotOptimize(out.data_ptr());
    state.SetIterationTime(start.elapsed_time(stop) / 1000.0);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

/// The ATen path: the image processor on the GPU, then .to(bfloat16).
at::Tensor aten_batch(GpuInputs& in, const std::vector<at::Tensor>& pixels) {
  return in.processor->preprocess(pixels).pixel_values.to(at::kBFloat16);
}

/// The slot into `out` (B, 3, 640, 640) bfloat16; `declined` counts calls the kernel left.
at::Tensor slot_batch(GpuInputs& in, const std::vector<at::Tensor>& pixels, const at::Tensor& out,
                      std::int64_t& declined) {
  kernels::CallRecording rec;
  image::preprocess_into(in.preprocess, *in.processor, pixels, out);
  if (rec.calls().of(kernels::kImagePreprocess.name, "cuda") == 0) ++declined;
  return out;
}

at::Tensor batch_buffer(std::int64_t b) {
  return at::empty({b, 3, 640, 640}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16));
}

/// Decode, then preprocess by the ATen ops or (slot) the `image_preprocess` slot.
void decode_preprocess(benchmark::State& state, bool slot) {
  GpuInputs& in = gpu_inputs();
  if (!in.error.empty()) {
    state.SkipWithError(in.error.c_str());
    return;
  }
  const auto b = static_cast<std::size_t>(state.range(0));
  at::InferenceMode guard;
  std::size_t next = 0;
  std::int64_t declined = 0, slot_declined = 0;
  const at::Tensor out = slot ? batch_buffer(state.range(0)) : at::Tensor();
  time_batches(state, [&] {
    auto pixels = decode_next(in, b, next, declined);
    return slot ? slot_batch(in, pixels, out, slot_declined) : aten_batch(in, pixels);
  });
  state.counters["declined"] = static_cast<double>(declined);
  if (slot) state.counters["slot_declined"] = static_cast<double>(slot_declined);
  state.counters["files"] = static_cast<double>(in.files.size());
}

void BM_GpuDecodePreprocess(benchmark::State& state) { decode_preprocess(state, false); }
void BM_GpuDecodePreprocessSlot(benchmark::State& state) { decode_preprocess(state, true); }

void BM_GpuPreprocess(benchmark::State& state) {
  GpuInputs& in = gpu_inputs();
  if (!in.error.empty()) {
    state.SkipWithError(in.error.c_str());
    return;
  }
  const bool slot = state.range(1) == 1;
  at::InferenceMode guard;
  std::size_t next = 0;
  std::int64_t declined = 0, slot_declined = 0;
  const auto pixels = decode_next(in, static_cast<std::size_t>(state.range(0)), next, declined);
  const at::Tensor out = batch_buffer(state.range(0));
  time_batches(state, [&] {
    return slot ? slot_batch(in, pixels, out, slot_declined) : aten_batch(in, pixels);
  });
  state.counters["slot_declined"] = static_cast<double>(slot_declined);
}

BENCHMARK(BM_GpuDecodePreprocess)
    ->ArgName("batch")
    ->Arg(32)
    ->Arg(128)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuDecodePreprocessSlot)
    ->ArgName("batch")
    ->Arg(32)
    ->Arg(128)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuPreprocess)
    ->ArgNames({"batch", "path"})
    ->ArgsProduct({{32, 128}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
