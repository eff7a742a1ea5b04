// Intra-op parallelism of one worker thread (the preprocessing pool's), without touching the
// process-wide setting that a CPU model's forward uses. Torch-free header.
#pragma once

namespace libreyolo::models {

/// Makes ATen run the calling thread's operators with at most `threads` threads (1: on that
/// thread alone): its OpenMP thread count (the nthreads ICV, which libgomp keeps per thread)
/// becomes `threads`, so at::get_num_threads() is `threads` there and at::parallel_for forks no
/// larger team; so does MKL's count for this thread (mkl_set_num_threads_local, as
/// at::set_num_threads sets it), so that MKL's GEMMs fork none either. Other threads and the
/// process default (what at::set_num_threads sets) are unchanged. The preprocessing pool gives
/// each of its P threads max(1, cores / P) (server/core/core.cpp); a model's CPU instances share
/// the process's count (server/instance/model_instances.cpp).
///
/// Why: every preprocessing thread otherwise forks its own OpenMP team of hardware_concurrency
/// threads per resize and normalise, P x cores spinning threads on the cores; PyTorch's
/// DataLoader workers call torch.set_num_threads(1) for the same reason
/// (torch/utils/data/_utils/worker.py), and a process-wide call would also slow a CPU model.
///
/// Returns true when the limit holds (at::get_num_threads() == `threads` afterwards on this
/// thread); false for `threads` < 1, when ATen's parallel backend is not OpenMP or its runtime
/// exports no omp_set_num_threads (then the thread keeps ATen's default). Never throws.
bool use_intra_op_threads(int threads) noexcept;

/// The process's intra-op thread count (what at::set_num_threads or OMP_NUM_THREADS made it):
/// at::get_num_threads() as a new thread sees it, whatever the calling thread set for itself.
/// Starts and joins a thread; 1 when that fails. Never throws.
int process_intra_op_threads() noexcept;

}  // namespace libreyolo::models
