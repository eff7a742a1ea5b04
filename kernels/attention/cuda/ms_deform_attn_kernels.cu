// CUDA kernels of multi-scale deformable attention, forward and backward (see
// ms_deform_attn_cuda.h for the contract and docs/bench/kernels.md for measurements).
//
// Work split: one warp per (b, h, q), warps ordered with q fastest so that the 8 warps of a block
// sample the same head of 8 neighbouring queries (their footprints overlap: L1 reuse). Inside the
// warp, kG = C / kV lanes cover the C channels of a value row with one 16-byte load each (kV = 4
// float32 or 8 16-bit elements) and the kK = 32 / kG lane groups split the L*P sampling points;
// the forward reduces the groups with a fixed xor butterfly (deterministic). Channel counts other
// than 16/32/64/128 (or unaligned tensors) take a scalar kernel (lanes loop over channels).
// Coordinates, bilinear weights and accumulation are float32 whatever the storage dtype.
// Bilinear sampling as in fundamentalvision/Deformable-DETR ms_deform_im2col_cuda.cuh:
//   x = loc_x * W - 0.5, y = loc_y * H - 0.5; nothing when outside (-1, W) x (-1, H) (NaN too);
//   each of the 4 corners contributes only when inside the map (zeros padding).
#include "kernels/attention/cuda/ms_deform_attn_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace libreyolo::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // warps per block
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

// Storage type traits: 16-byte vector (un)packing and scalar conversion, all through float.
template <typename T>
struct Traits;

template <>
struct Traits<float> {
  static constexpr int kVec = 4;
  __device__ static __forceinline__ void unpack(const uint4& r, float* o) {
    o[0] = __uint_as_float(r.x);
    o[1] = __uint_as_float(r.y);
    o[2] = __uint_as_float(r.z);
    o[3] = __uint_as_float(r.w);
  }
  __device__ static __forceinline__ uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  }
  __device__ static __forceinline__ float to_float(float v) { return v; }
  __device__ static __forceinline__ float from_float(float v) { return v; }
};

// 16-bit storage: 8 values per 16-byte vector, two per 32-bit word; Tr converts a word to two
// floats (two) and two floats to a word (word).
template <typename Tr>
struct Packed16 {
  static constexpr int kVec = 8;
  __device__ static __forceinline__ void unpack(const uint4& r, float* o) {
    Tr::two(r.x, o);
    Tr::two(r.y, o + 2);
    Tr::two(r.z, o + 4);
    Tr::two(r.w, o + 6);
  }
  __device__ static __forceinline__ uint4 pack(const float* f) {
    return make_uint4(Tr::word(f[0], f[1]), Tr::word(f[2], f[3]), Tr::word(f[4], f[5]),
                      Tr::word(f[6], f[7]));
  }
};

template <>
struct Traits<__half> : Packed16<Traits<__half>> {
  __device__ static __forceinline__ void two(unsigned w, float* o) {
    o[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    o[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ static __forceinline__ unsigned word(float a, float b) {
    return static_cast<unsigned>(__half_as_ushort(__float2half_rn(a))) |
           (static_cast<unsigned>(__half_as_ushort(__float2half_rn(b))) << 16);
  }
  __device__ static __forceinline__ float to_float(__half v) { return __half2float(v); }
  __device__ static __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

template <>
struct Traits<__nv_bfloat16> : Packed16<Traits<__nv_bfloat16>> {
  __device__ static __forceinline__ void two(unsigned w, float* o) {
    o[0] = __uint_as_float(w << 16);  // bfloat16 is the high half of a float32
    o[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ static __forceinline__ unsigned word(float a, float b) {
    return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
           (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16);
  }
  __device__ static __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __forceinline__ __nv_bfloat16 from_float(float v) {
    return __float2bfloat16_rn(v);
  }
};

struct Level {
  int64_t start;
  int h;
  int w;
};

// Stages (H_l, W_l, start_l) in shared memory; every thread of the block must call it.
__device__ __forceinline__ void load_levels(Level* lv, const int64_t* shapes, const int64_t* starts,
                                            int L) {
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    lv[l].h = static_cast<int>(shapes[2 * l]);
    lv[l].w = static_cast<int>(shapes[2 * l + 1]);
    lv[l].start = starts[l];
  }
  __syncthreads();
}

// Bilinear footprint of one sampling point. Returns false when it contributes nothing.
struct Footprint {
  int y0, x0;
  float ly, lx, hy, hx;
};

// On a level of wf x hf pixels (the level's sizes as float).
__device__ __forceinline__ bool footprint(float loc_x, float loc_y, float wf, float hf,
                                          Footprint& f) {
  const float x = loc_x * wf - 0.5f;
  const float y = loc_y * hf - 0.5f;
  // Written so that NaN fails the test (NaN locations contribute 0, as in the reference kernel).
  if (!(y > -1.f && x > -1.f && y < hf && x < wf)) return false;
  const float fy = floorf(y), fx = floorf(x);
  f.y0 = static_cast<int>(fy);
  f.x0 = static_cast<int>(fx);
  f.ly = y - fy;
  f.lx = x - fx;
  f.hy = 1.f - f.ly;
  f.hx = 1.f - f.lx;
  return true;
}

__device__ __forceinline__ bool footprint(float loc_x, float loc_y, const Level& lev,
                                          Footprint& f) {
  return footprint(loc_x, loc_y, static_cast<float>(lev.w), static_cast<float>(lev.h), f);
}

// The footprint of sampling point i of a query's (x, y) location pairs `lp`.
template <typename TL, typename Lev>
__device__ __forceinline__ bool point_footprint(const TL* lp, int i, const Lev& lev, Footprint& f) {
  return footprint(Traits<TL>::to_float(lp[2 * i]), Traits<TL>::to_float(lp[2 * i + 1]), lev, f);
}

// The query (b, q, h) a warp computes and where its data lie: bqh indexes the (B, Q, H) rows of
// locations, attention weights and output; the value rows of (b, h) start at value_base, `row`
// elements apart.
template <typename TL>
struct Query {
  int64_t bqh, row, value_base;
  int LP;        // sampling points: L * P
  const TL* lp;  // (LP, 2) locations (x, y)
  const TL* ap;  // (LP) attention weights
};

template <typename TL>
__device__ __forceinline__ Query<TL> query_at(int64_t b, int64_t q, int h, int64_t S, int64_t Q,
                                              int H, int C, int L, int P, const TL* loc,
                                              const TL* attn) {
  Query<TL> r;
  r.LP = L * P;
  r.bqh = (b * Q + q) * H + h;
  r.lp = loc + r.bqh * r.LP * 2;
  r.ap = attn + r.bqh * r.LP;
  r.row = static_cast<int64_t>(H) * C;
  r.value_base = b * S * r.row + static_cast<int64_t>(h) * C;
  return r;
}

// The query of this warp in a 1-d grid of warps ordered (b, h, q), q fastest; false past the last
// one (warp-uniform).
template <typename TL>
__device__ __forceinline__ bool warp_query(int64_t B, int64_t S, int64_t Q, int H, int C, int L,
                                           int P, const TL* loc, const TL* attn, Query<TL>& r) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (warp >= B * H * Q) return false;
  const int64_t q = warp % Q, bh = warp / Q;
  r = query_at(bh / H, q, static_cast<int>(bh % H), S, Q, H, C, L, P, loc, attn);
  return true;
}

// Pixel index of corner k (0: (y0,x0), 1: (y0,x0+1), 2: (y0+1,x0), 3: (y0+1,x0+1)) or -1 when
// outside the level or outside [0, S) (malformed metadata never reads out of bounds).
__device__ __forceinline__ int64_t corner(const Footprint& f, const Level& lev, int k, int64_t S) {
  const int yy = f.y0 + (k >> 1), xx = f.x0 + (k & 1);
  if (yy < 0 || xx < 0 || yy >= lev.h || xx >= lev.w) return -1;
  const int64_t s = lev.start + static_cast<int64_t>(yy) * lev.w + xx;
  return (static_cast<uint64_t>(s) < static_cast<uint64_t>(S)) ? s : -1;
}

__device__ __forceinline__ float corner_weight(const Footprint& f, int k) {
  const float wy = (k >> 1) ? f.ly : f.hy;
  const float wx = (k & 1) ? f.lx : f.hx;
  return wy * wx;
}

// ---------------------------------------------------------------------------------------------
// Forward

// kU points per lane group are processed per step: their locations and weights are loaded first,
// then all 4 * kU corner rows are loaded unconditionally (invalid corners read row 0 and are
// masked out of the sum), so that each warp has 4 * kU independent 16-byte loads in flight
// instead of a chain of dependent ones (the decoder shapes are latency-bound).
template <typename T, typename TL, int kC, int kU>
__global__ void __launch_bounds__(kThreads)
    msda_forward_vec(const T* __restrict__ value, const int64_t* __restrict__ shapes,
                     const int64_t* __restrict__ starts, const TL* __restrict__ loc,
                     const TL* __restrict__ attn, T* __restrict__ out, int64_t B, int64_t S,
                     int64_t Q, int H, int L, int P) {
  using Tr = Traits<T>;
  constexpr int kV = Tr::kVec;
  constexpr int kG = kC / kV;  // lanes per value row
  constexpr int kK = 32 / kG;  // point groups per warp
  static_assert(kC % kV == 0 && kG >= 1 && kG <= 32, "channel split");
  __shared__ Level lv[kMaxLevels];
  load_levels(lv, shapes, starts, L);

  Query<TL> qy;
  if (!warp_query(B, S, Q, H, kC, L, P, loc, attn, qy)) return;  // warp-uniform
  const int lane = threadIdx.x & 31;
  const int g = lane % kG, slice = lane / kG;
  const T* vb = value + (qy.value_base + g * kV);

  float acc[kV];
#pragma unroll
  for (int c = 0; c < kV; ++c) acc[c] = 0.f;

  for (int i0 = slice; i0 < qy.LP; i0 += kK * kU) {
    float lx[kU], ly[kU], la[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // independent loads (index 0 stands in past the end)
      const int i = i0 + u * kK < qy.LP ? i0 + u * kK : 0;
      lx[u] = Traits<TL>::to_float(qy.lp[2 * i]);
      ly[u] = Traits<TL>::to_float(qy.lp[2 * i + 1]);
      la[u] = Traits<TL>::to_float(qy.ap[i]);
    }
    int64_t off[kU][4];
    float w[kU][4];
    bool ok[kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kK;
      Footprint f;
      const Level lev = lv[(i < qy.LP ? i : 0) / P];
      const bool inside = i < qy.LP && footprint(lx[u], ly[u], lev, f);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t s = inside ? corner(f, lev, k, S) : -1;
        ok[u][k] = s >= 0;
        off[u][k] = s >= 0 ? s * qy.row : 0;
        w[u][k] = s >= 0 ? la[u] * corner_weight(f, k) : 0.f;
      }
    }
    uint4 raw[kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) raw[u][k] = __ldg(reinterpret_cast<const uint4*>(vb + off[u][k]));
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!ok[u][k]) continue;  // row 0 stood in: never let it into the sum (NaN, Inf)
        float v[kV];
        Tr::unpack(raw[u][k], v);
#pragma unroll
        for (int c = 0; c < kV; ++c) acc[c] = fmaf(w[u][k], v[c], acc[c]);
      }
  }
#pragma unroll
  for (int off = kG; off < 32; off <<= 1) {
#pragma unroll
    for (int c = 0; c < kV; ++c) acc[c] += __shfl_xor_sync(kFull, acc[c], off);
  }
  if (slice == 0) *reinterpret_cast<uint4*>(out + qy.bqh * kC + g * kV) = Tr::pack(acc);
}

// The default forward (variant 0): blocks of 8 queries of one (b, h) from a 3-d grid (no 64-bit
// division per warp), 32-bit pixel indices, and wider lanes: kN 16-byte loads per lane and corner
// (32 bytes for float32 C >= 32), so that each warp instruction stream handles kK = 32 / kG points
// at once. The index math of a sampling point is the same for every lane of its group, so the
// cost per point falls with kK; this kernel is bound by instruction issue, not bytes (see
// docs/bench/kernels.md). Needs S < 2^30, B and H <= 65535.
struct LevelF {
  float hf, wf;
  int h, w, start;
};

__device__ __forceinline__ bool footprint(float loc_x, float loc_y, const LevelF& lev,
                                          Footprint& f) {
  return footprint(loc_x, loc_y, lev.wf, lev.hf, f);
}

// corner() in 32-bit indices (S < 2^30): the 4 corners' pixel indices, and whether each is inside
// the level and [0, S).
__device__ __forceinline__ void corners32(const Footprint& f, const LevelF& lev, int S, int idx[4],
                                          bool ok[4]) {
  const bool y0ok = f.y0 >= 0, y1ok = f.y0 + 1 < lev.h, x0ok = f.x0 >= 0, x1ok = f.x0 + 1 < lev.w;
  const int base = lev.start + f.y0 * lev.w + f.x0;
  idx[0] = base;
  idx[1] = base + 1;
  idx[2] = base + lev.w;
  idx[3] = base + lev.w + 1;
  ok[0] = y0ok && x0ok;
  ok[1] = y0ok && x1ok;
  ok[2] = y1ok && x0ok;
  ok[3] = y1ok && x1ok;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    ok[k] = ok[k] && static_cast<unsigned>(idx[k]) < static_cast<unsigned>(S);
}

template <typename T, typename TL, int kC>
__global__ void __launch_bounds__(kThreads)
    msda_forward_v2(const T* __restrict__ value, const int64_t* __restrict__ shapes,
                    const int64_t* __restrict__ starts, const TL* __restrict__ loc,
                    const TL* __restrict__ attn, T* __restrict__ out, int S, int Q, int H, int L,
                    int P) {
  using Tr = Traits<T>;
  constexpr int kVec = Tr::kVec;
  constexpr int kRowVecs = kC / kVec;        // 16-byte vectors per value row
  constexpr int kN = kRowVecs >= 8 ? 2 : 1;  // vectors per lane and corner
  constexpr int kG = kRowVecs / kN;          // lanes per value row
  constexpr int kK = 32 / kG;                // points handled at once per warp
  static_assert(kC % kVec == 0 && kG >= 1 && kG <= 32 && kRowVecs % kN == 0, "channel split");
  __shared__ LevelF lv[kMaxLevels];
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    const int hl = static_cast<int>(shapes[2 * l]), wl = static_cast<int>(shapes[2 * l + 1]);
    lv[l] = {static_cast<float>(hl), static_cast<float>(wl), hl, wl, static_cast<int>(starts[l])};
  }
  __syncthreads();
  const int q = blockIdx.x * kWarps + static_cast<int>(threadIdx.x / 32);
  if (q >= Q) return;  // warp-uniform
  const Query<TL> qy = query_at(blockIdx.z, q, blockIdx.y, S, Q, H, kC, L, P, loc, attn);
  const int lane = threadIdx.x & 31;
  const int g = lane % kG, slice = lane / kG;
  const int LP = qy.LP;
  const int64_t row = qy.row;
  const T* vb = value + (qy.value_base + g * kVec);
  const float inv_p = 1.f / static_cast<float>(P);

  float acc[kN * kVec];
#pragma unroll
  for (int c = 0; c < kN * kVec; ++c) acc[c] = 0.f;

  for (int i = slice; i < LP; i += kK) {
    // i / P without an integer division: (i + 0.5) / P is at least 0.5 / P away from an integer.
    const LevelF lev = lv[__float2int_rz((static_cast<float>(i) + 0.5f) * inv_p)];
    Footprint f;
    if (!point_footprint(qy.lp, i, lev, f)) continue;
    const float a = Traits<TL>::to_float(qy.ap[i]);
    int idx[4];
    bool ok[4];
    corners32(f, lev, S, idx, ok);
    float wt[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) wt[k] = corner_weight(f, k) * a;
    uint4 raw[4][kN];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int n = 0; n < kN; ++n)
        raw[k][n] = ok[k] ? __ldg(reinterpret_cast<const uint4*>(
                                vb + static_cast<int64_t>(idx[k]) * row + n * kG * kVec))
                          : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (!ok[k]) continue;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        float v[kVec];
        Tr::unpack(raw[k][n], v);
#pragma unroll
        for (int c = 0; c < kVec; ++c) acc[n * kVec + c] = fmaf(wt[k], v[c], acc[n * kVec + c]);
      }
    }
  }
#pragma unroll
  for (int off = kG; off < 32; off <<= 1) {
#pragma unroll
    for (int c = 0; c < kN * kVec; ++c) acc[c] += __shfl_xor_sync(kFull, acc[c], off);
  }
  if (slice == 0) {
#pragma unroll
    for (int n = 0; n < kN; ++n)
      *reinterpret_cast<uint4*>(out + qy.bqh * kC + g * kVec + n * kG * kVec) =
          Tr::pack(acc + n * kVec);
  }
}

template <typename T, typename TL>
__global__ void __launch_bounds__(kThreads)
    msda_forward_generic(const T* __restrict__ value, const int64_t* __restrict__ shapes,
                         const int64_t* __restrict__ starts, const TL* __restrict__ loc,
                         const TL* __restrict__ attn, T* __restrict__ out, int64_t B, int64_t S,
                         int64_t Q, int H, int C, int L, int P) {
  __shared__ Level lv[kMaxLevels];
  load_levels(lv, shapes, starts, L);
  Query<TL> qy;
  if (!warp_query(B, S, Q, H, C, L, P, loc, attn, qy)) return;
  const int lane = threadIdx.x & 31;
  const T* vb = value + qy.value_base;
  for (int c0 = 0; c0 < C; c0 += 32) {
    const int c = c0 + lane;
    if (c >= C) break;
    float acc = 0.f;
    for (int i = 0; i < qy.LP; ++i) {
      const Level lev = lv[i / P];
      Footprint f;
      if (!point_footprint(qy.lp, i, lev, f)) continue;
      const float a = Traits<TL>::to_float(qy.ap[i]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t s = corner(f, lev, k, S);
        if (s < 0) continue;
        acc = fmaf(a * corner_weight(f, k), Traits<T>::to_float(vb[s * qy.row + c]), acc);
      }
    }
    out[qy.bqh * C + c] = Traits<T>::from_float(acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: grad_value += a * w_k * g (float32 atomics), grad_attn = sum_c g * sample,
// grad_loc = a * (W, H) * sum_c g * d(sample)/d(x, y), with
//   d/dx = -hy*v00 + hy*v01 - ly*v10 + ly*v11,  d/dy = -hx*v00 - lx*v01 + hx*v10 + lx*v11.

template <int kV>
__device__ __forceinline__ void atomic_add_vec(float* p, const float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
  for (int j = 0; j < kV; j += 4)
    atomicAdd(reinterpret_cast<float4*>(p + j), make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]));
#else
#pragma unroll
  for (int j = 0; j < kV; ++j) atomicAdd(p + j, v[j]);
#endif
}

__device__ __forceinline__ float dwx(const Footprint& f, int k) {
  const float wy = (k >> 1) ? f.ly : f.hy;
  return (k & 1) ? wy : -wy;
}
__device__ __forceinline__ float dwy(const Footprint& f, int k) {
  const float wx = (k & 1) ? f.lx : f.hx;
  return (k >> 1) ? wx : -wx;
}

// Adds corner k's share to a point's gradients (ga: attention weight, gx / gy: location before
// the scaling below), with w = corner_weight(f, k) and dot = sum_c g * v_k (of this lane).
__device__ __forceinline__ void add_corner_grads(const Footprint& f, int k, float w, float dot,
                                                 float& ga, float& gx, float& gy) {
  ga = fmaf(w, dot, ga);
  gx = fmaf(dwx(f, k), dot, gx);
  gy = fmaf(dwy(f, k), dot, gy);
}

// From d(sample)/d(x, y) to the location's gradient: x = loc_x * W - 0.5, times the weight a.
__device__ __forceinline__ void scale_location_grads(float a, const Level& lev, float& gx,
                                                     float& gy) {
  gx *= a * static_cast<float>(lev.w);
  gy *= a * static_cast<float>(lev.h);
}

// Sums a point's gradients over the lanes that share it (xor distances kFrom, kFrom / 2, ..., 1)
// and, where `store`, writes them at point j = bqh * LP + i.
template <int kFrom, typename TL>
__device__ __forceinline__ void reduce_store_point_grads(float ga, float gx, float gy, bool store,
                                                         int64_t j, TL* grad_attn, TL* grad_loc) {
#pragma unroll
  for (int off = kFrom; off >= 1; off >>= 1) {
    ga += __shfl_xor_sync(kFull, ga, off);
    gx += __shfl_xor_sync(kFull, gx, off);
    gy += __shfl_xor_sync(kFull, gy, off);
  }
  if (store) {
    grad_attn[j] = Traits<TL>::from_float(ga);
    grad_loc[j * 2] = Traits<TL>::from_float(gx);
    grad_loc[j * 2 + 1] = Traits<TL>::from_float(gy);
  }
}

template <typename T, typename TL, int kC>
__global__ void __launch_bounds__(kThreads)
    msda_backward_vec(const T* __restrict__ value, const int64_t* __restrict__ shapes,
                      const int64_t* __restrict__ starts, const TL* __restrict__ loc,
                      const TL* __restrict__ attn, const T* __restrict__ grad_out,
                      float* __restrict__ grad_value, TL* __restrict__ grad_loc,
                      TL* __restrict__ grad_attn, int64_t B, int64_t S, int64_t Q, int H, int L,
                      int P) {
  using Tr = Traits<T>;
  constexpr int kV = Tr::kVec;
  constexpr int kG = kC / kV;
  constexpr int kK = 32 / kG;
  __shared__ Level lv[kMaxLevels];
  load_levels(lv, shapes, starts, L);

  Query<TL> qy;
  if (!warp_query(B, S, Q, H, kC, L, P, loc, attn, qy)) return;
  const int lane = threadIdx.x & 31;
  const int g = lane % kG, slice = lane / kG;
  const int64_t base = qy.value_base + g * kV;
  const T* vb = value + base;
  float* gvb = grad_value + base;

  float go[kV];
  Tr::unpack(__ldg(reinterpret_cast<const uint4*>(grad_out + qy.bqh * kC + g * kV)), go);

  for (int i0 = 0; i0 < qy.LP; i0 += kK) {  // same trip count in every lane: shuffles below
    const int i = i0 + slice;
    const bool valid = i < qy.LP;
    float ga = 0.f, gx = 0.f, gy = 0.f;
    if (valid) {
      const Level lev = lv[i / P];
      Footprint f;
      if (point_footprint(qy.lp, i, lev, f)) {
        const float a = Traits<TL>::to_float(qy.ap[i]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int64_t s = corner(f, lev, k, S);
          if (s < 0) continue;
          float v[kV];
          Tr::unpack(__ldg(reinterpret_cast<const uint4*>(vb + s * qy.row)), v);
          float dot = 0.f;
#pragma unroll
          for (int c = 0; c < kV; ++c) dot = fmaf(go[c], v[c], dot);
          const float w = corner_weight(f, k);
          add_corner_grads(f, k, w, dot, ga, gx, gy);
          const float aw = a * w;
          float add[kV];
#pragma unroll
          for (int c = 0; c < kV; ++c) add[c] = aw * go[c];
          atomic_add_vec<kV>(gvb + s * qy.row, add);
        }
        scale_location_grads(a, lev, gx, gy);
      }
    }
    reduce_store_point_grads<kG / 2>(ga, gx, gy, valid && g == 0, qy.bqh * qy.LP + i, grad_attn,
                                     grad_loc);
  }
}

template <typename T, typename TL>
__global__ void __launch_bounds__(kThreads)
    msda_backward_generic(const T* __restrict__ value, const int64_t* __restrict__ shapes,
                          const int64_t* __restrict__ starts, const TL* __restrict__ loc,
                          const TL* __restrict__ attn, const T* __restrict__ grad_out,
                          float* __restrict__ grad_value, TL* __restrict__ grad_loc,
                          TL* __restrict__ grad_attn, int64_t B, int64_t S, int64_t Q, int H, int C,
                          int L, int P) {
  __shared__ Level lv[kMaxLevels];
  load_levels(lv, shapes, starts, L);
  Query<TL> qy;
  if (!warp_query(B, S, Q, H, C, L, P, loc, attn, qy)) return;
  const int lane = threadIdx.x & 31;
  const int64_t base = qy.value_base;
  const T* go = grad_out + qy.bqh * C;
  for (int i = 0; i < qy.LP; ++i) {  // one point per iteration for the whole warp
    const Level lev = lv[i / P];
    Footprint f;
    float ga = 0.f, gx = 0.f, gy = 0.f;
    if (point_footprint(qy.lp, i, lev, f)) {
      const float a = Traits<TL>::to_float(qy.ap[i]);
      for (int k = 0; k < 4; ++k) {
        const int64_t s = corner(f, lev, k, S);
        if (s < 0) continue;
        const float w = corner_weight(f, k);
        float dot = 0.f;
        for (int c = lane; c < C; c += 32) {
          const float gc = Traits<T>::to_float(go[c]);
          dot = fmaf(gc, Traits<T>::to_float(value[base + s * qy.row + c]), dot);
          atomicAdd(grad_value + base + s * qy.row + c, a * w * gc);
        }
        add_corner_grads(f, k, w, dot, ga, gx, gy);
      }
      scale_location_grads(a, lev, gx, gy);
    }
    reduce_store_point_grads<16>(ga, gx, gy, lane == 0, qy.bqh * qy.LP + i, grad_attn, grad_loc);
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers

int g_forward_variant = 0;  // see set_forward_variant

struct Dims {
  int64_t B, S, Q;
  int H, C, L, P;
};

Dims dims_of(const at::Tensor& value, const at::Tensor& loc) {
  return {value.size(0),
          value.size(1),
          loc.size(1),
          static_cast<int>(value.size(2)),
          static_cast<int>(value.size(3)),
          static_cast<int>(loc.size(3)),
          static_cast<int>(loc.size(4))};
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
const T* ptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* mut(at::Tensor& t) {
  return reinterpret_cast<T*>(t.mutable_data_ptr());
}

unsigned blocks_for(const Dims& d) {
  const int64_t warps = d.B * d.H * d.Q;
  return static_cast<unsigned>((warps + kWarps - 1) / kWarps);
}

template <typename T, typename TL>
void forward_typed(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& starts,
                   const at::Tensor& loc, const at::Tensor& attn, at::Tensor& out, const Dims& d) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  const dim3 grid(blocks_for(d)), block(kThreads);
  const bool vec = aligned16(value.const_data_ptr()) && aligned16(out.const_data_ptr());
#define LIBREYOLO_MSDA_FWD_U(CH, U)                                                           \
  msda_forward_vec<T, TL, CH, U><<<grid, block, 0, stream>>>(                                 \
      ptr<T>(value), ptr<int64_t>(shapes), ptr<int64_t>(starts), ptr<TL>(loc), ptr<TL>(attn), \
      mut<T>(out), d.B, d.S, d.Q, d.H, d.L, d.P)
#define LIBREYOLO_MSDA_FWD(CH)   \
  if (unroll >= 4) {             \
    LIBREYOLO_MSDA_FWD_U(CH, 4); \
  } else if (unroll == 2) {      \
    LIBREYOLO_MSDA_FWD_U(CH, 2); \
  } else {                       \
    LIBREYOLO_MSDA_FWD_U(CH, 1); \
  }
  const int unroll = g_forward_variant;
  const bool v2 = unroll == 0 && d.S > 0 && d.S < (int64_t{1} << 30) && d.B <= 65535 &&
                  d.H <= 65535 && d.Q < (int64_t{1} << 30);
  if (vec && v2 && (d.C == 16 || d.C == 32 || d.C == 64 || d.C == 128)) {
    const dim3 grid2(static_cast<unsigned>((d.Q + kWarps - 1) / kWarps), d.H,
                     static_cast<unsigned>(d.B));
#define LIBREYOLO_MSDA_FWD2(CH)                                                               \
  msda_forward_v2<T, TL, CH><<<grid2, block, 0, stream>>>(                                    \
      ptr<T>(value), ptr<int64_t>(shapes), ptr<int64_t>(starts), ptr<TL>(loc), ptr<TL>(attn), \
      mut<T>(out), static_cast<int>(d.S), static_cast<int>(d.Q), d.H, d.L, d.P)
    switch (d.C) {
      case 16:
        LIBREYOLO_MSDA_FWD2(16);
        break;
      case 32:
        LIBREYOLO_MSDA_FWD2(32);
        break;
      case 64:
        LIBREYOLO_MSDA_FWD2(64);
        break;
      default:
        LIBREYOLO_MSDA_FWD2(128);
    }
#undef LIBREYOLO_MSDA_FWD2
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  switch (vec && d.S > 0 ? d.C : 0) {
    case 16:
      LIBREYOLO_MSDA_FWD(16);
      break;
    case 32:
      LIBREYOLO_MSDA_FWD(32);
      break;
    case 64:
      LIBREYOLO_MSDA_FWD(64);
      break;
    case 128:
      LIBREYOLO_MSDA_FWD(128);
      break;
    default:
      msda_forward_generic<T, TL><<<grid, block, 0, stream>>>(
          ptr<T>(value), ptr<int64_t>(shapes), ptr<int64_t>(starts), ptr<TL>(loc), ptr<TL>(attn),
          mut<T>(out), d.B, d.S, d.Q, d.H, d.C, d.L, d.P);
  }
#undef LIBREYOLO_MSDA_FWD_U
#undef LIBREYOLO_MSDA_FWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename TL>
void backward_typed(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& starts,
                    const at::Tensor& loc, const at::Tensor& attn, const at::Tensor& grad_out,
                    at::Tensor& grad_value, at::Tensor& grad_loc, at::Tensor& grad_attn,
                    const Dims& d) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  const dim3 grid(blocks_for(d)), block(kThreads);
  const bool vec = aligned16(value.const_data_ptr()) && aligned16(grad_out.const_data_ptr()) &&
                   aligned16(grad_value.const_data_ptr());
#define LIBREYOLO_MSDA_BWD(CH)                                                                   \
  msda_backward_vec<T, TL, CH><<<grid, block, 0, stream>>>(                                      \
      ptr<T>(value), ptr<int64_t>(shapes), ptr<int64_t>(starts), ptr<TL>(loc), ptr<TL>(attn),    \
      ptr<T>(grad_out), mut<float>(grad_value), mut<TL>(grad_loc), mut<TL>(grad_attn), d.B, d.S, \
      d.Q, d.H, d.L, d.P)
  switch (vec ? d.C : 0) {
    case 16:
      LIBREYOLO_MSDA_BWD(16);
      break;
    case 32:
      LIBREYOLO_MSDA_BWD(32);
      break;
    case 64:
      LIBREYOLO_MSDA_BWD(64);
      break;
    case 128:
      LIBREYOLO_MSDA_BWD(128);
      break;
    default:
      msda_backward_generic<T, TL><<<grid, block, 0, stream>>>(
          ptr<T>(value), ptr<int64_t>(shapes), ptr<int64_t>(starts), ptr<TL>(loc), ptr<TL>(attn),
          ptr<T>(grad_out), mut<float>(grad_value), mut<TL>(grad_loc), mut<TL>(grad_attn), d.B, d.S,
          d.Q, d.H, d.C, d.L, d.P);
  }
#undef LIBREYOLO_MSDA_BWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct ForwardFn {
  const at::Tensor &value, &shapes, &starts, &loc, &attn;
  at::Tensor& out;
  const Dims& d;
  template <typename T, typename TL>
  void run() const {
    forward_typed<T, TL>(value, shapes, starts, loc, attn, out, d);
  }
};

struct BackwardFn {
  const at::Tensor &value, &shapes, &starts, &loc, &attn, &grad_out;
  at::Tensor &grad_value, &grad_loc, &grad_attn;
  const Dims& d;
  template <typename T, typename TL>
  void run() const {
    backward_typed<T, TL>(value, shapes, starts, loc, attn, grad_out, grad_value, grad_loc,
                          grad_attn, d);
  }
};

// Calls fn.template run<T, TL>() for the (value, location) dtype pair.
template <typename Fn>
void dispatch(at::ScalarType value_type, at::ScalarType loc_type, const Fn& fn) {
  const bool loc_f32 = loc_type == at::kFloat;
  switch (value_type) {
    case at::kFloat:
      TORCH_CHECK(loc_f32, "ms_deform_attn cuda: locations must be float32 for float32 value");
      fn.template run<float, float>();
      return;
    case at::kHalf:
      if (loc_f32) {
        fn.template run<__half, float>();
      } else {
        TORCH_CHECK(loc_type == at::kHalf, "ms_deform_attn cuda: location dtype");
        fn.template run<__half, __half>();
      }
      return;
    case at::kBFloat16:
      if (loc_f32) {
        fn.template run<__nv_bfloat16, float>();
      } else {
        TORCH_CHECK(loc_type == at::kBFloat16, "ms_deform_attn cuda: location dtype");
        fn.template run<__nv_bfloat16, __nv_bfloat16>();
      }
      return;
    default:
      TORCH_CHECK(false, "ms_deform_attn cuda: unsupported value dtype ", value_type);
  }
}

}  // namespace

void set_forward_variant(int variant) {
  g_forward_variant = variant >= 4 ? 4 : variant < 0 ? 0 : variant == 3 ? 2 : variant;
}

at::Tensor ms_deform_attn_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                                  const at::Tensor& level_start_index,
                                  const at::Tensor& sampling_locations,
                                  const at::Tensor& attention_weights) {
  const c10::cuda::CUDAGuard guard(value.device());
  const Dims d = dims_of(value, sampling_locations);
  TORCH_CHECK(d.L <= kMaxLevels, "ms_deform_attn cuda: at most ", kMaxLevels, " levels");
  auto out = at::empty({d.B, d.Q, static_cast<int64_t>(d.H) * d.C}, value.options());
  if (out.numel() == 0) return out;
  dispatch(value.scalar_type(), sampling_locations.scalar_type(),
           ForwardFn{value, spatial_shapes, level_start_index, sampling_locations,
                     attention_weights, out, d});
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward(
    const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
    const at::Tensor& sampling_locations, const at::Tensor& attention_weights,
    const at::Tensor& grad_output) {
  const c10::cuda::CUDAGuard guard(value.device());
  const Dims d = dims_of(value, sampling_locations);
  TORCH_CHECK(d.L <= kMaxLevels, "ms_deform_attn cuda: at most ", kMaxLevels, " levels");
  const auto grad_out = grad_output.to(value.scalar_type()).contiguous();
  auto grad_value = at::zeros(value.sizes(), value.options().dtype(at::kFloat));
  auto grad_loc = at::empty_like(sampling_locations);
  auto grad_attn = at::empty_like(attention_weights);
  if (d.B * d.Q * d.H > 0) {
    dispatch(value.scalar_type(), sampling_locations.scalar_type(),
             BackwardFn{value, spatial_shapes, level_start_index, sampling_locations,
                        attention_weights, grad_out, grad_value, grad_loc, grad_attn, d});
  }
  if (value.scalar_type() != at::kFloat) grad_value = grad_value.to(value.scalar_type());
  return {grad_value, grad_loc, grad_attn};
}

}  // namespace libreyolo::kernels::cuda
