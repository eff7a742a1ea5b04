// cublaslt_linear (kernels/gemm/cuda/cublaslt_gemm.h): one cublasLtMatmul per call, its algorithm
// timed once per problem.
#include "kernels/gemm/cuda/cublaslt_gemm.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/event_pair.h"

namespace libreyolo::kernels::cuda {
namespace {

/// Candidates timed per problem (the heuristic's list, best guess first).
constexpr int kCandidates = 16;
/// Timed runs per candidate after one warm-up (their mean is compared).
constexpr int kTimedRuns = 5;
/// The smallest problem (2 M N K floating-point operations) whose algorithm is timed; smaller ones
/// run the heuristic's first. Below it a forward is launch-bound (batch 1), and choices timed
/// there, back to back on hot caches, made RF-DETR's and LW-DETR's batch-1 CUDA graphs 1-2.5%
/// slower on an H100 while the batch-32 ones (backbone GEMMs of 12-50 GFLOP) gained 1-4%
/// (docs/BENCHMARKS.md, 2026-12-06).
constexpr double kTimedMinFlops = 4e9;
/// Workspace offered to every algorithm (ATen offers cuBLASLt as much on Hopper).
constexpr std::size_t kWorkspaceBytes = 32u << 20;

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("cublaslt: ") + what + " failed with status " +
                           std::to_string(static_cast<int>(status)));
}

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string("cublaslt: ") + what +
                           " failed: " + cudaGetErrorString(status));
}

/// The largest power of two (up to 256) that divides the address: cuBLASLt's alignment
/// preferences, so that the heuristic offers only algorithms these pointers can run.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

/// (device, M, N, K, x's row stride, dtype, epilogue, bias, alignment of x, weight, out, bias).
using ProblemKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int, int, bool, uint32_t,
                              uint32_t, uint32_t, uint32_t>;

/// Handles no thread holds, per device: a thread hands its own back when it ends, and a later
/// thread takes one instead of creating another (ATen's DeviceThreadHandlePool does the same), so
/// that threads which come and go (a model loaded from the model-control API loads on a thread
/// of its own) do not leak one handle each. Never destroyed: destroying a handle at process exit
/// may run after the CUDA runtime unloaded.
struct LtHandlePool {
  std::mutex mu;
  std::map<int, std::vector<cublasLtHandle_t>> free;
};
LtHandlePool& lt_handle_pool() {
  static auto* pool = new LtHandlePool;
  return *pool;
}

/// This thread's handles, back to the pool when the thread ends.
struct ThreadLtHandles {
  std::map<int, cublasLtHandle_t> handles;
  ~ThreadLtHandles() {
    auto& pool = lt_handle_pool();
    std::lock_guard<std::mutex> lk(pool.mu);
    for (const auto& [device, h] : handles) pool.free[device].push_back(h);
  }
};

/// This thread's cuBLASLt handle for the current device, created by the cuBLASLt this library
/// links (ATen's handle may come from another copy of the library: the official LibTorch
/// distribution bundles its own, and a handle must not cross copies). Kept for the thread's life,
/// then reused by another thread.
cublasLtHandle_t lt_handle(int device) {
  thread_local ThreadLtHandles mine;
  auto it = mine.handles.find(device);
  if (it != mine.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  {
    auto& pool = lt_handle_pool();
    std::lock_guard<std::mutex> lk(pool.mu);
    auto& free = pool.free[device];
    if (!free.empty()) {
      h = free.back();
      free.pop_back();
    }
  }
  if (h == nullptr) check(cublasLtCreate(&h), "cublasLtCreate");
  mine.handles.emplace(device, h);
  return h;
}

/// The most problems whose timed choice is kept; later ones run the heuristic's first (a
/// daemon with dynamic shapes would otherwise time, and keep, every new row count).
constexpr std::size_t kMaxTimedProblems = 512;

std::mutex& timed_mutex() {
  static std::mutex mu;
  return mu;
}
/// The timed choice per problem: process-wide, like cuDNN's benchmark cache (a measurement of
/// this GPU, valid while the process lives).
std::map<ProblemKey, cublasLtMatmulAlgo_t>& timed_algorithms() {
  static auto* m = new std::map<ProblemKey, cublasLtMatmulAlgo_t>();  // never destroyed
  return *m;
}

/// The descriptors of one call, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cublasLtEpilogue_t epilogue_of(GemmEpilogue e, bool bias) {
  switch (e) {
    case GemmEpilogue::relu:
      return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::gelu:
      return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::none:
      break;
  }
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

const char* cublaslt_linear_declines(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias) {
  if (!x.is_cuda()) return "cublaslt: not a CUDA tensor";
  const auto dtype = x.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16)
    return "cublaslt: dtype (float16, bfloat16 only)";
  if (weight.device() != x.device() || weight.scalar_type() != dtype ||
      (bias.defined() && (bias.device() != x.device() || bias.scalar_type() != dtype)))
    return "cublaslt: weight or bias of another device or dtype";
  if (x.dim() < 1 || weight.dim() != 2 || weight.size(1) != x.size(-1) ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))))
    return "cublaslt: shapes";
  if (x.numel() == 0) return "cublaslt: empty input";
  if (weight.size(1) % 8 != 0 || weight.size(0) % 8 != 0)
    return "cublaslt: K or N not a multiple of 8";
  if (!weight.is_contiguous() || (bias.defined() && !bias.is_contiguous()))
    return "cublaslt: weight or bias not contiguous";
  auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (!aligned(x) || !aligned(weight) || (bias.defined() && !aligned(bias)))
    return "cublaslt: an operand not 16-byte aligned";
  return nullptr;
}

at::Tensor cublaslt_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           GemmEpilogue epilogue, GemmAlgorithm algorithm) {
  if (const char* why = cublaslt_linear_declines(x, weight, bias))
    throw std::invalid_argument(std::string(why));
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t k = x.size(-1), n = weight.size(0);
  // Rows with a stride (a slice of a wider tensor: packed projections) are read in place, as
  // ATen's GEMM reads them, when that stride keeps 16-byte rows; anything else is copied.
  at::Tensor rows = x.reshape({-1, k});
  const int64_t m = rows.size(0);
  const int64_t ld = m > 1 ? rows.stride(0) : k;
  if (rows.stride(1) != 1 || ld < k || ld % 8 != 0) rows = rows.contiguous();
  const int64_t ld_rows = rows.is_contiguous() ? k : ld;
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = n;
  at::Tensor out = at::empty({m, n}, rows.options());

  // Row-major out (M, N) = rows (M, K) . weight (N, K)^T is, column-major, out^T (N, M) =
  // weight^T' (N, K) . rows^T (K, M): A = the weight as a K x N column-major matrix, transposed;
  // B = the rows as a K x M column-major matrix; D = N x M.
  const cudaDataType_t type = x.scalar_type() == at::kHalf ? CUDA_R_16F : CUDA_R_16BF;
  Descriptors desc;
  check(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  check(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)),
      "MatmulDescSetAttribute(TRANSA)");
  check(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)),
      "MatmulDescSetAttribute(TRANSB)");
  const cublasLtEpilogue_t ep = epilogue_of(epilogue, bias.defined());
  check(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)),
        "MatmulDescSetAttribute(EPILOGUE)");
  if (bias.defined()) {
    const void* bias_ptr = bias.data_ptr();
    check(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                         sizeof(bias_ptr)),
          "MatmulDescSetAttribute(BIAS_POINTER)");
  }
  check(cublasLtMatrixLayoutCreate(&desc.a, type, k, n, k), "MatrixLayoutCreate(A)");
  check(cublasLtMatrixLayoutCreate(&desc.b, type, k, m, ld_rows), "MatrixLayoutCreate(B)");
  check(cublasLtMatrixLayoutCreate(&desc.d, type, n, m, n), "MatrixLayoutCreate(D)");

  const uint32_t align_a = alignment(weight.data_ptr()), align_b = alignment(rows.data_ptr()),
                 align_d = alignment(out.data_ptr()),
                 align_bias = bias.defined() ? alignment(bias.data_ptr()) : 0;
  check(cublasLtMatmulPreferenceCreate(&desc.preference), "MatmulPreferenceCreate");
  const std::size_t workspace_bytes = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(desc.preference,
                                             CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof(workspace_bytes)),
        "MatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns{{
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d},
  }};
  for (const auto& [attribute, bytes] : aligns)
    check(cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &bytes, sizeof(bytes)),
          "MatmulPreferenceSetAttribute(MIN_ALIGNMENT)");

  cublasLtHandle_t handle = lt_handle(x.get_device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const at::Tensor workspace =
      at::empty({static_cast<int64_t>(workspace_bytes)}, rows.options().dtype(at::kByte));
  const float one = 1.0f, zero = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, desc.op, &one, weight.data_ptr(), desc.a, rows.data_ptr(), desc.b,
                          &zero, out.data_ptr(), desc.d, out.data_ptr(), desc.d, &algo,
                          workspace.data_ptr(), workspace_bytes, stream);
  };

  if (2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <
      kTimedMinFlops)
    algorithm = GemmAlgorithm::heuristic;
  const ProblemKey key{x.get_device(),
                       m,
                       n,
                       k,
                       ld_rows,
                       static_cast<int>(type),
                       static_cast<int>(ep),
                       bias.defined(),
                       align_b,
                       align_a,
                       align_d,
                       align_bias};
  if (algorithm == GemmAlgorithm::timed) {
    std::optional<cublasLtMatmulAlgo_t> kept;
    {
      std::lock_guard<std::mutex> lock(timed_mutex());
      const auto it = timed_algorithms().find(key);
      if (it != timed_algorithms().end()) kept = it->second;
    }
    if (kept) {
      check(run(*kept), "Matmul");
      return out.view(out_sizes);
    }
  }
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> found{};
  int returned = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                       desc.preference, kCandidates, found.data(), &returned),
        "MatmulAlgoGetHeuristic");
  if (returned == 0) return at::Tensor();  // nothing for these operands: the caller declines

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (algorithm == GemmAlgorithm::heuristic || capture != cudaStreamCaptureStatusNone ||
      returned == 1) {
    check(run(found[0].algo), "Matmul");
    if (algorithm == GemmAlgorithm::timed && capture == cudaStreamCaptureStatusNone) {
      std::lock_guard<std::mutex> lock(timed_mutex());
      if (timed_algorithms().size() < kMaxTimedProblems)
        timed_algorithms().emplace(key, found[0].algo);
    }
    return out.view(out_sizes);
  }

  // Time the candidates on this call's operands; out is overwritten by each, then by the best.
  int best = -1;
  float best_ms = 0.0f;
  {
    const EventPair events;
    if (!events.ok()) throw std::runtime_error("cublaslt: cudaEventCreate failed");
    for (int i = 0; i < returned; ++i) {
      if (found[i].state != CUBLAS_STATUS_SUCCESS || run(found[i].algo) != CUBLAS_STATUS_SUCCESS)
        continue;  // an algorithm these operands cannot run: not a candidate
      bool ran = cudaEventRecord(events.start, stream) == cudaSuccess;
      for (int r = 0; r < kTimedRuns && ran; ++r) ran = run(found[i].algo) == CUBLAS_STATUS_SUCCESS;
      ran = ran && cudaEventRecord(events.stop, stream) == cudaSuccess;
      float ms = 0.0f;
      if (!ran || cudaEventSynchronize(events.stop) != cudaSuccess ||
          cudaEventElapsedTime(&ms, events.start, events.stop) != cudaSuccess)
        continue;
      if (best < 0 || ms < best_ms) {
        best = i;
        best_ms = ms;
      }
    }
  }
  if (best < 0) best = 0;  // nothing could be timed: the heuristic's first, as ATen runs
  check(run(found[best].algo), "Matmul");
  {
    std::lock_guard<std::mutex> lock(timed_mutex());
    if (timed_algorithms().size() < kMaxTimedProblems)
      timed_algorithms().emplace(key, found[best].algo);
  }
  return out.view(out_sizes);
}

std::size_t cublaslt_timed_problems() {
  std::lock_guard<std::mutex> lock(timed_mutex());
  return timed_algorithms().size();
}

void cublaslt_forget_timed_problems() {
  std::lock_guard<std::mutex> lock(timed_mutex());
  timed_algorithms().clear();
}

}  // namespace libreyolo::kernels::cuda
