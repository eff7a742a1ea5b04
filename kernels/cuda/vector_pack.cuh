// What the in-tree elementwise CUDA kernels share: loading and storing N elements as one
// (kernels/conv/cuda/bias_act_kernels.cu, kernels/pool/cuda/max_pool2d_kernels.cu).
#pragma once

#include <cstdint>

namespace libreyolo::kernels::cuda {

/// N elements of T as one load or store: 16 bytes when N = 16 / sizeof(T), one element when
/// N = 1. Dereferencing a Pack* needs an address aligned to sizeof(T) * N.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

/// Whether p may be read as a 16-byte Pack.
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace libreyolo::kernels::cuda
