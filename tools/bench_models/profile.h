// Where a forward's GPU time goes, by op class, from the torch profiler (Kineto, CUPTI) driven
// from C++ (torch/csrc/autograd/profiler_kineto.h): the breakdown that shows what the layouts
// change (docs/BENCHMARKS.md).
#pragma once

#include <functional>
#include <string>

namespace libreyolo::bench {

/// Runs `forward` `iters` times under the profiler (CPU and CUDA activities) and returns lines
/// `profile class=<c> ms_per_forward=<x> share=<p>% kernels_per_forward=<n>` for the classes
/// conv, gemm, elementwise, norm_softmax_reduce, ms_deform_attn, attention, copy, other, sorted by
/// time, then `profile total_gpu_ms_per_forward=<x>`, the 12 slowest kernel names, and the 8
/// slowest of each of the classes copy, elementwise and other (`profile class_kernel class=<c>
/// ms_per_forward=<x> launches_per_forward=<n> name=<kernel>`), then the 16 costliest op chains
/// that launched copy and elementwise kernels (`profile op_chain class=<c> ms_per_forward=<x>
/// launches_per_forward=<n> ops=<outer>>...><inner>`, from Kineto's kernel-to-op links). GPU time
/// is the sum of kernel durations (no overlap correction: one stream).
/// A forward that launched no CUDA kernel (a CPU model) is reported by its ATen ops instead:
/// `profile class=<c> ms_per_forward=<x> share=<p>% ops_per_forward=<n>` for the classes above
/// plus pool, then `profile total_cpu_ms_per_forward=<x>` and the 16 ops with the most self time
/// (`profile op ms_per_forward=<x> calls_per_forward=<n> class=<c> name=<op>`), then where the
/// time of the copy, elementwise, norm_softmax_reduce, conv and gemm classes goes, by enclosing
/// ops and input shapes (`profile copy ...` and `profile site class=<c> ms_per_forward=<x>
/// calls_per_forward=<n> at=<parents>><op> <shapes>`). An op's time is its self time on the thread
/// that called it (its wall time less that of the ops it called), so oneDNN's and ATen's worker
/// threads count inside the op that used them and the classes add up to the forward's wall time
/// less what ran outside ATen ops. `launches` first lists the first forward's kernels in launch
/// order (`profile launch <i> class=<c> ops=<chain> name=<kernel>`; on the CPU its leaf ops:
/// `profile launch <i> class=<c> ops=<parents>><op> <shapes>`), for counting launches: kernels
/// ordered by their start on the GPU (one stream assumed), the first 1/iters of them taken as one
/// forward (every forward assumed to launch the same); kernels that no ATen op launched show
/// `ops=?`.
/// Throws std::runtime_error when the profiler cannot start.
std::string profile_by_op_class(const std::function<void()>& forward, int iters,
                                bool launches = false);

}  // namespace libreyolo::bench
