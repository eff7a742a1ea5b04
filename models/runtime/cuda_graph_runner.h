// CUDA-graph execution of a model's forward at fixed batch sizes (the daemon's serving.yaml
// `cuda_graphs`, libreyolo-bench-models --cuda-graph).
// A graph replays the whole forward with one launch: at batch 1 the host's kernel-launch cost,
// not the GPU, bounds an eager RT-DETR (docs/BENCHMARKS.md, "End-to-end forward, RT-DETR with
// random weights at 640x640 (H200)": R50 bf16, eager against replayed). TensorRT/Triton call the
// same idea "optimization profiles"; here a batch is padded up to the next captured size, as vLLM
// does for its decode graphs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "models/model.h"

namespace libreyolo::models {

class CudaGraphRunner {
 public:
  /// Captures `model.forward` on zeros of shape (b, 3, height, width) in `dtype` on `device`
  /// (CUDA) for every b in `batch_sizes` (sorted, deduplicated; each >= 1), after one eager
  /// warm-up per size, on a side stream, all graphs sharing one memory pool and one input tensor
  /// (each graph reads its first b rows).
  /// The caller holds `model` alive for the runner's lifetime; fixed-size inputs only (no
  /// pixel_mask). Throws std::runtime_error naming the batch size when a capture fails (a
  /// host synchronisation inside forward, a CPU device, a LibTorch without CUDA).
  CudaGraphRunner(const Model& model, std::vector<int64_t> batch_sizes, int64_t height,
                  int64_t width, at::ScalarType dtype, at::Device device);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  /// True when `pixel_values` (B, 3, H, W) matches the captured (H, W, dtype, device) and B is
  /// at most the largest captured batch size.
  bool accepts(const at::Tensor& pixel_values) const;

  /// Copies `pixel_values` into the smallest captured input with batch >= B (zero padding),
  /// replays, and returns the first B rows of the outputs as new tensors (the graph's outputs
  /// are overwritten by the next replay). Each replay adds the kernel-registry calls made while
  /// that graph was captured to the registry's calls counters (kernels::CallRecording), so they
  /// count what ran. Not thread-safe: one caller (the model's batcher).
  /// Throws std::invalid_argument when !accepts(pixel_values).
  ModelOutput run(const at::Tensor& pixel_values);

  /// The captured batch sizes, ascending.
  std::vector<int64_t> batch_sizes() const;

  /// True when this build can capture CUDA graphs at all (LibTorch with CUDA).
  static bool supported();

  /// Batch sizes to capture for `max_batch_size`, as vLLM's cudagraph capture sizes: 1, 2, 4,
  /// the multiples of 8 below it, then it (32 -> 1, 2, 4, 8, 16, 24, 32; 6 -> 1, 2, 4, 6;
  /// 20 -> 1, 2, 4, 8, 16, 20).
  static std::vector<int64_t> default_batch_sizes(int64_t max_batch_size);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libreyolo::models
