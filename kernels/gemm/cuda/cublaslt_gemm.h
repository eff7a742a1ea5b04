// Linear layers as one cuBLASLt matmul whose algorithm is chosen by timing, not by heuristic.
//
// ATen's CUDA Linear (at::linear / at::_addmm_activation, aten/src/ATen/native/cuda/Blas.cpp)
// runs the first algorithm of cublasLtMatmulAlgoGetHeuristic's list. For the short-K GEMMs of the
// ViT backbones (K = 384 in RF-DETR's DINOv2: about 460 TFLOP/s against 720 at K = 1,536 on an
// H100, docs/BENCHMARKS.md) and the small-M GEMMs of batch 1 (M = 1,300 rows fill a fraction of
// the SMs with the heuristic's tile), that first guess is often not the fastest. ATen's TunableOp
// would time candidates, but on CUDA it registers only its "Default" (aten/src/ATen/cuda/tunable/
// TunableGemm.h: the cuBLASLt / hipBLASLt candidates are ROCm-only), so the timing is done here,
// as cuDNN's benchmark mode does for convolutions.
//
// Per problem (device, M, N, K, dtype, epilogue, operand alignments) of at least 4 GFLOP (smaller
// ones, the launch-bound GEMMs of batch 1, run the heuristic's first: choices timed there made
// whole batch-1 graphs slower), the first call outside a CUDA-graph capture times up to 16
// of the heuristic's algorithms on the call's own operands (one warm-up and 5 timed runs each,
// CUDA events on the current stream, which the timing synchronises once) and keeps the fastest for
// the process's life; the result is then written by that algorithm. A call during a capture uses
// the heuristic's first algorithm without keeping it (nothing can be timed there; CudaGraphRunner
// warms up eagerly first, so its problems are tuned by then). The choice is a measurement: two
// processes may keep different algorithms and so differ in the last bit of a 16-bit result, as with
// cuDNN's benchmark mode.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace libreyolo::kernels::cuda {

/// The matmul's epilogue: bias (or none), optionally followed by an activation.
enum class GemmEpilogue { none, relu, gelu };

/// How the algorithm is picked: timed (above), or the heuristic's first (ATen's choice).
enum class GemmAlgorithm { timed, heuristic };

/// y = epilogue(x W^T + b): x (..., K), weight (N, K), bias (N) or undefined, all float16 or all
/// bfloat16 on one CUDA device; float32 accumulation. Returns (..., N) in x's dtype, contiguous,
/// or an undefined tensor when cuBLASLt offers no algorithm for these operands (the caller
/// declines). gelu is cuBLASLt's GELU epilogue (the tanh form, as at::_addmm_activation's); relu
/// is exact. Runs on a cuBLASLt handle of its own per thread and device, with a 32 MiB
/// workspace from the caching allocator per call (inside a CUDA-graph capture: from the graph's
/// pool, once per graph). At most 512 timed choices are kept; later problems run the
/// heuristic's first. Throws std::invalid_argument for what cublaslt_linear_declines names,
/// std::runtime_error naming the cuBLASLt or CUDA call that failed.
at::Tensor cublaslt_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           GemmEpilogue epilogue, GemmAlgorithm algorithm = GemmAlgorithm::timed);

/// Why cublaslt_linear cannot take these operands (a string literal), or nullptr: not CUDA, not
/// float16 / bfloat16, mixed dtypes or devices, K or N not a multiple of 8 (16-byte rows), an
/// empty input, a weight that is not row-major contiguous, an operand whose first element is not
/// 16-byte aligned.
const char* cublaslt_linear_declines(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias);

/// The problems whose algorithm is kept (for tests of the cache).
std::size_t cublaslt_timed_problems();

/// Forgets every kept choice (tests: each starts from an empty cache).
void cublaslt_forget_timed_problems();

}  // namespace libreyolo::kernels::cuda
