#include "models/runtime/intra_op_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace libreyolo::models {

bool use_intra_op_threads(int threads) noexcept {
  if (threads < 1) return false;
  try {
    // ATen sets a thread's OpenMP count lazily, at its first parallel query
    // (at::internal::lazy_init_num_threads in ATen/ParallelOpenMP.cpp), to the process setting:
    // trigger that first, or it would undo the limit at the thread's first resize.
    if (at::get_num_threads() == threads) return true;
    // The OpenMP runtime LibTorch loaded (the wheel's own libgomp), found at run time: linking
    // one ourselves (-fopenmp) would load a second runtime beside it.
    using SetNumThreads = void (*)(int);
    static const auto set_num_threads =
        reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set_num_threads == nullptr) return false;
    set_num_threads(threads);
    return at::get_num_threads() == threads;
  } catch (...) {
    return false;
  }
}

}  // namespace libreyolo::models
