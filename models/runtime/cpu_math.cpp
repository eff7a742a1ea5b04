#include "models/runtime/cpu_math.h"

#include <ATen/ATen.h>

#include <mutex>

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

}  // namespace libreyolo::models
