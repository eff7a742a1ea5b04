#include "models/runtime/cuda_graph_runner.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "kernels/registry.h"

#if LIBREYOLO_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace libreyolo::models {

#if LIBREYOLO_TORCH_CUDA

struct CudaGraphRunner::Impl {
  struct Captured {
    at::Tensor input;  ///< static (b, 3, H, W), the first b rows of the runner's one input: replays
                       ///< read it
    ModelOutput output;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    kernels::RecordedCalls calls;  ///< registry calls made while capturing: one replay redoes them
  };
  int64_t height = 0, width = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCUDA;
  std::map<int64_t, Captured> graphs;  ///< by batch size
};

CudaGraphRunner::CudaGraphRunner(const Model& model, std::vector<int64_t> batch_sizes,
                                 int64_t height, int64_t width, at::ScalarType dtype,
                                 at::Device device)
    : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda()) throw std::runtime_error("cuda_graphs: the model is not on a CUDA device");
  if (height <= 0 || width <= 0)
    throw std::runtime_error("cuda_graphs: needs a fixed input size (processor height/width)");
  std::sort(batch_sizes.begin(), batch_sizes.end());
  batch_sizes.erase(std::unique(batch_sizes.begin(), batch_sizes.end()), batch_sizes.end());
  if (batch_sizes.empty() || batch_sizes.front() < 1)
    throw std::runtime_error("cuda_graphs: batch sizes must be >= 1");
  // "cuda" means the current device; tensors always carry an index, and accepts() compares.
  if (!device.has_index()) device = at::Device(at::kCUDA, c10::cuda::current_device());
  impl_->height = height;
  impl_->width = width;
  impl_->dtype = dtype;
  impl_->device = device;
  const c10::cuda::CUDAGuard device_guard(device);
  // Graphs cannot capture the legacy default stream; one pool for all sizes, largest first, so
  // that the smaller graphs reuse its blocks (their lifetimes never overlap: one replay at a time).
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, device.index()));
  const auto pool = at::cuda::graph_pool_handle();
  at::InferenceMode inference;
  // One input for every graph, each reading its first b rows: one replay at a time, and run()
  // fills a graph's rows before it replays. An input per graph held 87 images at max_batch_size
  // 32 with vLLM's capture sizes, 32 this way.
  const at::Tensor input = at::zeros({batch_sizes.back(), 3, height, width},
                                     at::TensorOptions().dtype(dtype).device(device));
  for (auto it = batch_sizes.rbegin(); it != batch_sizes.rend(); ++it) {
    const int64_t b = *it;
    Impl::Captured c;
    c.input = input.narrow(0, 0, b);
    try {
      model.forward(c.input);  // eager warm-up: lazy initialisations happen outside the capture
      c10::cuda::getCurrentCUDAStream().synchronize();
      c.graph = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local capture: other models loading on other threads may allocate meanwhile.
      c.graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      try {
        kernels::CallRecording recording;
        c.output = model.forward(c.input);
        c.calls = recording.calls();
      } catch (...) {
        // Leave capture mode so that the stream stays usable, then report the forward's error.
        cudaGraph_t aborted = nullptr;
        cudaStreamEndCapture(c10::cuda::getCurrentCUDAStream().stream(), &aborted);
        if (aborted) cudaGraphDestroy(aborted);
        (void)cudaGetLastError();
        throw;
      }
      c.graph->capture_end();
    } catch (const std::exception& e) {
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      throw std::runtime_error(
          c10::str("cuda_graphs: capture of batch size ", b, " failed: ", what));
    }
    impl_->graphs.emplace(b, std::move(c));
  }
  c10::cuda::getCurrentCUDAStream().synchronize();
}

CudaGraphRunner::~CudaGraphRunner() = default;

bool CudaGraphRunner::accepts(const at::Tensor& pv) const {
  return pv.defined() && pv.dim() == 4 && pv.size(0) >= 1 && pv.size(1) == 3 &&
         pv.size(2) == impl_->height && pv.size(3) == impl_->width &&
         pv.scalar_type() == impl_->dtype && pv.device() == impl_->device &&
         pv.size(0) <= impl_->graphs.rbegin()->first;
}

ModelOutput CudaGraphRunner::run(const at::Tensor& pv) {
  if (!accepts(pv))
    throw std::invalid_argument(
        c10::str("cuda_graphs: pixel_values ", pv.sizes(), " does not match a captured graph"));
  const int64_t n = pv.size(0);
  auto& c = impl_->graphs.lower_bound(n)->second;
  const c10::cuda::CUDAGuard device_guard(impl_->device);
  at::InferenceMode inference;
  // Replayed on the caller's current stream, so copies in and out are ordered with it.
  c.input.narrow(0, 0, n).copy_(pv);
  if (c.input.size(0) > n) c.input.narrow(0, n, c.input.size(0) - n).zero_();
  c.graph->replay();
  // The slots' implementations ran again without being called: count them (/active, metrics).
  kernels::Registry::count_replayed(c.calls);
  ModelOutput out;
  out.logits = c.output.logits.narrow(0, 0, n).clone();
  if (c.output.pred_boxes.defined()) out.pred_boxes = c.output.pred_boxes.narrow(0, 0, n).clone();
  if (c.output.pred_masks.defined()) out.pred_masks = c.output.pred_masks.narrow(0, 0, n).clone();
  if (c.output.order_logits.defined())
    out.order_logits = c.output.order_logits.narrow(0, 0, n).clone();
  return out;
}

std::vector<int64_t> CudaGraphRunner::batch_sizes() const {
  std::vector<int64_t> sizes;
  for (const auto& [b, c] : impl_->graphs) sizes.push_back(b);
  return sizes;
}

bool CudaGraphRunner::supported() { return true; }

#else  // LibTorch without CUDA: the runner cannot exist.

struct CudaGraphRunner::Impl {};

CudaGraphRunner::CudaGraphRunner(const Model&, std::vector<int64_t>, int64_t, int64_t,
                                 at::ScalarType, at::Device) {
  throw std::runtime_error("cuda_graphs: this build's LibTorch has no CUDA");
}
CudaGraphRunner::~CudaGraphRunner() = default;
bool CudaGraphRunner::accepts(const at::Tensor&) const { return false; }
ModelOutput CudaGraphRunner::run(const at::Tensor&) {
  throw std::invalid_argument("cuda_graphs: this build's LibTorch has no CUDA");
}
std::vector<int64_t> CudaGraphRunner::batch_sizes() const { return {}; }
bool CudaGraphRunner::supported() { return false; }

#endif

std::vector<int64_t> CudaGraphRunner::default_batch_sizes(int64_t max_batch_size) {
  // vLLM's cudagraph capture sizes (1, 2, 4, then every multiple of 8): a batch of 17-23 runs
  // as 24, not 32. Served at 64 closed-loop clients the batches average 20-24 images, and
  // padded to 32 they filled the GPU with zeros (docs/BENCHMARKS.md, "Served JPEG").
  std::vector<int64_t> sizes;
  for (int64_t b = 1; b < max_batch_size && b < 8; b *= 2) sizes.push_back(b);
  for (int64_t b = 8; b < max_batch_size; b += 8) sizes.push_back(b);
  if (max_batch_size >= 1) sizes.push_back(max_batch_size);
  return sizes;
}

}  // namespace libreyolo::models
