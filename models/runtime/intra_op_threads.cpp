#include "models/runtime/intra_op_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <thread>

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
    // MKL's own per-thread count (LibTorch's static MKL exports it; absent in builds without
    // MKL): at::set_num_threads set it to the process's count at the lazy initialisation above.
    // MKL_Set_Num_Threads_Local is the C entry (mkl_service.h maps mkl_set_num_threads_local to
    // it); the exported lower-case symbol is the Fortran one, which takes a pointer.
    using MklSetLocal = int (*)(int);
    static const auto mkl_set_local =
        reinterpret_cast<MklSetLocal>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
    if (mkl_set_local != nullptr) mkl_set_local(threads);
    return at::get_num_threads() == threads;
  } catch (...) {
    return false;
  }
}

int process_intra_op_threads() noexcept {
  int n = 1;
  try {
    std::thread([&n] { n = at::get_num_threads(); }).join();
  } catch (...) {
    return 1;
  }
  return std::max(n, 1);
}

}  // namespace libreyolo::models
