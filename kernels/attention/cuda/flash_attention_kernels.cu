// CUDA kernel of the small-head attention (see flash_attention_cuda.h for the why and the
// algorithm). Fragment layouts: PTX ISA "Matrix fragments for mma.m16n8k16" and "ldmatrix";
// g = lane / 4 and t = lane % 4 below. A block is 4 warps = 64 query rows of one (b, h); each
// warp owns 16 rows and walks every 64-key tile:
//   S (16 x 64) = Q K^T   8 n-tiles of 8 keys, d / 16 k-steps each, K read with ldmatrix (K's
//                         rows are B's columns: no transpose);
//   online softmax        thread (g, t) holds rows g and g + 8, keys 8j + 2t, 8j + 2t + 1;
//                         the row max is completed across the 4 lanes of a row (shfl_xor 1, 2);
//   O (16 x d) += P V     P's A fragments are the S accumulators of n-tiles 2kk, 2kk + 1
//                         rounded to T; V read with ldmatrix.trans; one more n-tile multiplies
//                         P by ones, so the tensor cores also sum the rows (the normaliser).
// Shared rows are padded to d + 8 elements, so the 8 rows of an ldmatrix hit distinct banks.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda/flash_attention_cuda.h"

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockQ = kWarps * 16;  // query rows per block
constexpr int kBlockK = 64;           // keys per tile

// Blocks per SM the register allocation must allow. Without a bound ptxas gave d = 16 96
// registers and spilled; 6 blocks (24 warps) fit it in 80 without spilling, and d = 32 needs
// about 120 (4 blocks). Checked with -Xptxas -v for sm_90.
template <int D>
inline constexpr int kMinBlocks = D == 16 ? 6 : 4;

struct Params {
  const char* q;
  const char* k;
  const char* v;
  char* out;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, head, token; in elements
  int heads, lq, lk, q_blocks;
  float scale_log2;  // scale * log2(e)
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src-size 0: nothing read).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  // c += a b, m16n8k16, bf16 inputs, float32 accumulators.
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  }
};

// 2^x on the SFU (ex2.approx: 2 ulp; -inf -> +0). The kernel is bound by these.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>) flash_attention_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // cp.async and bf16 mma.sync need sm_80: a build for older GPUs gets this stub, which
  // flash_attention_available() reports as absent (binaryVersion < 80), so it never runs.
  __trap();
#else
  constexpr int kPitch = D + 8;     // elements per shared row (bank-conflict-free ldmatrix)
  constexpr int kChunks = D / 8;    // 16-byte chunks per row
  constexpr int kSteps = D / 16;    // k-steps of Q K^T
  constexpr int kOutTiles = D / 8;  // n-tiles of P V
  __shared__ __align__(16) T q_tile[kBlockQ * kPitch];
  __shared__ __align__(16) T k_tile[2][kBlockK * kPitch];
  __shared__ __align__(16) T v_tile[2][kBlockK * kPitch];

  const int q_block = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.q_blocks));
  const int bh = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.q_blocks));
  const int h = bh % p.heads, b = bh / p.heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const T* q = reinterpret_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
  const T* k = reinterpret_cast<const T*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1];
  const T* v = reinterpret_cast<const T*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];
  const int q0 = q_block * kBlockQ;

  // Rows of a 64-row tile, chunk by chunk: kBlockK * kChunks chunks over kThreads threads.
  auto stage = [&](T* dst, const T* src, int64_t stride, int first, int count) {
#pragma unroll
    for (int c = tid; c < kBlockK * kChunks; c += kThreads) {
      const int row = c / kChunks, chunk = c % kChunks;
      const bool valid = first + row < count;
      const T* from = valid ? src + (first + row) * stride + chunk * 8 : src;
      copy16(dst + row * kPitch + chunk * 8, from, valid);
    }
  };
  const int tiles = (p.lk + kBlockK - 1) / kBlockK;
  stage(q_tile, q, p.q_stride[2], q0, p.lq);
  stage(k_tile[0], k, p.k_stride[2], 0, p.lk);
  stage(v_tile[0], v, p.v_stride[2], 0, p.lk);
  commit();

  uint32_t qa[kSteps][4];
  // o[kOutTiles] is P times a tile of ones: every lane's c0 / c2 there is the row sum of the
  // rounded probabilities (the normaliser of what P V summed), accumulated by the tensor cores
  // instead of 32 dependent float adds per lane and tile.
  float o[kOutTiles + 1][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 units, rows g and g + 8
  const uint32_t ones = Mma<T>::pack(1.f, 1.f);

  for (int tile = 0; tile < tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < tiles) {
      stage(k_tile[buf ^ 1], k, p.k_stride[2], (tile + 1) * kBlockK, p.lk);
      stage(v_tile[buf ^ 1], v, p.v_stride[2], (tile + 1) * kBlockK, p.lk);
      commit();
      wait_pending<1>();
    } else {
      wait_pending<0>();
    }
    __syncthreads();
    if (tile == 0) {
      // A fragments of the warp's 16 rows: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15).
      const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
        ldmatrix_x4(qa[s], q_tile + row * kPitch + s * 16 + (lane >> 4) * 8);
    }
    const T* kt = k_tile[buf];
    const T* vt = v_tile[buf];

    float s[kBlockK / 8][4];
#pragma unroll
    for (int j = 0; j < kBlockK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int pair = 0; pair < kBlockK / 16; ++pair) {
      // Keys 16 pair + (0-7 | 8-15) x d (0-7 | 8-15): B fragments of n-tiles 2 pair, 2 pair + 1.
      const int key = pair * 16 + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kt + key * kPitch + st * 16 + ((lane >> 3) & 1) * 8);
        Mma<T>::run(s[2 * pair], qa[st], kb[0], kb[1]);
        Mma<T>::run(s[2 * pair + 1], qa[st], kb[2], kb[3]);
      }
    }
    const int key0 = tile * kBlockK;
    if (key0 + kBlockK > p.lk) {  // the last tile: keys past Lk score -inf
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (key0 + j * 8 + (lane & 3) * 2 + (e & 1) >= p.lk) s[j][e] = -INFINITY;
    }
    // Online softmax (FlashAttention-2 Algorithm 1, lines 8-10), base 2.
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // The row max as a tree (depth 4, not a chain of 16 dependent maxima).
      float m[kBlockK / 8];
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) m[j] = fmaxf(s[j][2 * r], s[j][2 * r + 1]);
#pragma unroll
      for (int w = kBlockK / 16; w > 0; w /= 2)
#pragma unroll
        for (int j = 0; j < w; ++j) m[j] = fmaxf(m[j], m[j + w]);
      float mx = fmaxf(m[0], __shfl_xor_sync(0xffffffffu, m[0], 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // Every tile holds a valid key, so mx is finite; the first tile's correction is 2^-inf = 0.
      const float next = fmaxf(row_max[r], mx * p.scale_log2);
      corr[r] = exp2_approx(row_max[r] - next);
      row_max[r] = next;
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) {
        s[j][2 * r] = exp2_approx(fmaf(s[j][2 * r], p.scale_log2, -next));
        s[j][2 * r + 1] = exp2_approx(fmaf(s[j][2 * r + 1], p.scale_log2, -next));
      }
    }
#pragma unroll
    for (int n = 0; n <= kOutTiles; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    // O += P V, 16 keys per k-step.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      const uint32_t pa[4] = {Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                              Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                              Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      // Keys 16 kk + (0-7 | 8-15) x d (n0 + 0-7 | n0 + 8-15), transposed: b0/b1 of two n-tiles.
      const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int n = 0; n < kOutTiles; n += 2) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vt + key * kPitch + n * 8 + (lane >> 4) * 8);
        Mma<T>::run(o[n], pa, vb[0], vb[1]);
        Mma<T>::run(o[n + 1], pa, vb[2], vb[3]);
      }
      Mma<T>::run(o[kOutTiles], pa, ones, ones);
    }
    __syncthreads();  // the next iteration refills the buffer just read
  }

  // Normalise and store rows g and g + 8 into out (B, Lq, H, D).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = 1.f / o[kOutTiles][2 * r];
    const int row = q0 + warp * 16 + (lane >> 2) + r * 8;
    if (row >= p.lq) continue;
    T* out = reinterpret_cast<T*>(p.out) + ((int64_t(b) * p.lq + row) * p.heads + h) * D;
#pragma unroll
    for (int n = 0; n < kOutTiles; ++n)
      *reinterpret_cast<uint32_t*>(out + n * 8 + (lane & 3) * 2) =
          Mma<T>::pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
#endif
}

template <typename T, int D>
void launch(const Params& p, int64_t blocks, cudaStream_t stream) {
  flash_attention_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/// flash_attention_available's probe (uncached).
bool probe_device(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8)
    return false;
  // Whether this build holds code for the device (CMAKE_CUDA_ARCHITECTURES), sm_80 or newer.
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return false;
  if (cudaSetDevice(device) != cudaSuccess) return false;
  cudaFuncAttributes attributes{};
  const bool present = cudaFuncGetAttributes(
                           &attributes, flash_attention_kernel<__nv_bfloat16, 16>) == cudaSuccess &&
                       attributes.binaryVersion >= 80;
  (void)cudaSetDevice(current);
  (void)cudaGetLastError();  // a missing image leaves no sticky error behind
  return present;
}

}  // namespace

bool flash_attention_available(int device) {
  // Answered once per device (the first answer is kept: the build and the GPU do not change).
  static std::array<std::atomic<int>, 64> known{};  // 0 unknown, 1 no, 2 yes
  if (device < 0 || device >= static_cast<int>(known.size())) return false;
  if (const int k = known[device].load(std::memory_order_acquire)) return k == 2;
  const bool yes = probe_device(device);
  known[device].store(yes ? 2 : 1, std::memory_order_release);
  return yes;
}

bool flash_attention_supports_head_dim(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32;
}

bool flash_attention_rows_aligned(const at::Tensor& t) {
  return t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flash_attention: q, k, v must be (B, H, L, d)");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2), d = q.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(1) == H && v.size(1) == H &&
                  v.size(2) == Lk && k.size(3) == d && v.size(3) == d,
              "flash_attention: shapes ", q.sizes(), ", ", k.sizes(), ", ", v.sizes(),
              " do not match");
  TORCH_CHECK(flash_attention_supports_head_dim(d), "flash_attention: head_dim ", d,
              " (16 or 32 only)");
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kHalf || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
                  v.scalar_type() == dtype,
              "flash_attention: float16 or bfloat16 q, k, v of one dtype");
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device(),
              "flash_attention: q, k, v on one CUDA device");
  TORCH_CHECK(flash_attention_rows_aligned(q) && flash_attention_rows_aligned(k) &&
                  flash_attention_rows_aligned(v),
              "flash_attention: rows must be contiguous, 16-byte aligned, strides multiples of 8");
  TORCH_CHECK(Lk >= 1, "flash_attention: no keys");
  TORCH_CHECK(flash_attention_available(q.get_device()),
              "flash_attention: no sm_80+ code for this device in the build");
  const int64_t q_blocks = (Lq + kBlockQ - 1) / kBlockQ, blocks = q_blocks * H * B;
  TORCH_CHECK(blocks <= INT32_MAX && Lq <= INT32_MAX && Lk <= INT32_MAX,
              "flash_attention: too large (", blocks, " blocks)");
  const c10::cuda::CUDAGuard guard(q.device());
  auto out = at::empty({B, Lq, H, d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (blocks == 0) return out.transpose(1, 2);
  Params p{};
  p.q = static_cast<const char*>(q.data_ptr());
  p.k = static_cast<const char*>(k.data_ptr());
  p.v = static_cast<const char*>(v.data_ptr());
  p.out = static_cast<char*>(out.data_ptr());
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.stride(i);
    p.k_stride[i] = k.stride(i);
    p.v_stride[i] = v.stride(i);
  }
  p.heads = static_cast<int>(H);
  p.lq = static_cast<int>(Lq);
  p.lk = static_cast<int>(Lk);
  p.q_blocks = static_cast<int>(q_blocks);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // log2(e)
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (dtype == at::kBFloat16)
    d == 16 ? launch<__nv_bfloat16, 16>(p, blocks, stream)
            : launch<__nv_bfloat16, 32>(p, blocks, stream);
  else
    d == 16 ? launch<__half, 16>(p, blocks, stream) : launch<__half, 32>(p, blocks, stream);
  return out.transpose(1, 2);
}

}  // namespace libreyolo::kernels::cuda
