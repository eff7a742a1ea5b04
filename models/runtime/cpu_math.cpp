#include "models/runtime/cpu_math.h"

#include <ATen/ATen.h>

#include <mutex>

#include "kernels/cpu/parallel.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LIBREYOLO_HAS_MXCSR 1
#endif

namespace libreyolo::models {

void initialise_cpu_math() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      // Eight elements are far below at::internal::GRAIN_SIZE: one thread makes the call. tanh
      // is the operator seen to race; VML's initialisation is shared by all of its functions.
      (void)at::tanh(at::zeros({8}, at::kFloat));
    } catch (...) {
      // Nothing to initialise on a build whose tanh fails here; the forward reports its own error.
    }
  });
}

bool flush_denormals_by_default(int dtype) noexcept {
  const auto t = static_cast<at::ScalarType>(dtype);
  return t == at::kBFloat16 || t == at::kHalf;
}

#ifdef LIBREYOLO_HAS_MXCSR
namespace {
void set_ftz_daz() noexcept {
  // Bits 15 (FTZ) and 6 (DAZ) of MXCSR (Intel SDM vol. 1, 10.2.3).
  _mm_setcsr(_mm_getcsr() | 0x8040u);
}
}  // namespace
#endif

bool flush_denormals_on_this_thread() noexcept {
#ifdef LIBREYOLO_HAS_MXCSR
  set_ftz_daz();
  try {
    const int64_t n = at::get_num_threads();
    // One single-item chunk per team thread (at::parallel_for's OpenMP backend hands thread t
    // the items [t * ceil(n / threads), ...)).
    at::parallel_for(0, n, 1, [](int64_t, int64_t) { set_ftz_daz(); });
  } catch (...) {
    // A team that could not run: the calling thread keeps the setting, its team does not.
  }
  return true;
#else
  return false;
#endif
}

}  // namespace libreyolo::models
