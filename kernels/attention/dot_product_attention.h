// Dense multi-head attention, the `attention` slot: softmax(q k^T * scale + bias) v.
//
// Implementations, in call order:
//   cuda           CUDA models, in builds with the CUDA kernels: unbiased float16 / bfloat16
//                  calls with heads of 16 or 32 (kernels/attention/cuda/flash_attention_cuda.h),
//                  where SDPA's cuDNN kernel pads the head to 64.
//   mem_efficient  CUDA models: SDPA's memory-efficient (cutlass) kernel called directly on a
//                  16-aligned bias; takes the shape classes attention_path() assigns to it.
//   sdpa           at::scaled_dot_product_attention (and its padded-mask / window-batch forms);
//                  takes every shape class attention_path() does not leave to the manual math.
//   reference      the manual math, transformers `eager_attention_forward`: matmul, * scale,
//                  + bias, softmax, matmul. Defines the numbers (the parity fixtures).
// The fused ones differ from the reference at the 1e-7..1e-6 level, so whether a model calls
// the slot at all is a per-module flag (`fused_attn`, models/layers/attention.h), off by default
// for every family (docs/DESIGN.md "Fused attention"); the `kernels.fused_attention` policy and
// serving.yaml flip it. Which fused formulation is fastest per shape class was measured on the
// H200 (docs/bench/attention.md, tools/bench_attention).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/slot.h"

namespace libreyolo::kernels {

/// The formulations of one attention call. All compute softmax(q k^T * scale + bias) v; they
/// differ in kernels and memory traffic (docs/bench/attention.md measures them).
enum class AttentionPath {
  kManual,           ///< matmul, * scale, + bias, softmax, matmul (transformers eager)
  kSdpa,             ///< at::scaled_dot_product_attention, bias expanded to (B, H, Lq, Lk)
  kSdpaPaddedMask,   ///< SDPA, the bias copied once into storage whose rows are padded to a
                     ///< multiple of 8 elements (SDPA's memory-efficient kernel would pad it
                     ///< again otherwise: sdp_utils preprocess_mask)
  kSdpaWindowBatch,  ///< window bias only: q/k/v laid out (B, nW*H, L, d) so that the bias is
                     ///< one (1, nW*H, L, L) tensor broadcast over the images (no per-image copy)
  kMemEfficient,     ///< CUDA only: SDPA's memory-efficient (cutlass) kernel called directly
                     ///< (at::_scaled_dot_product_efficient_attention) on the 16-aligned mask;
                     ///< SDPA itself would pick cuDNN for a biased fp16/bf16 call (slower)
};

/// What the bias of a call is: none, a dense tensor broadcastable to (B, H, Lq, Lk), or a
/// per-window bias (nW, H or 1, L, L) shared by every image (Swin: relative position bias plus
/// the shifted-window mask; batch index i uses window i % nW).
enum class BiasKind { kNone, kDense, kWindow };

/// "manual", "sdpa", "sdpa_padded_mask", "sdpa_window_batch", "mem_efficient".
const char* attention_path_name(AttentionPath path);

/// The fused formulation for a shape class: the fastest one measured within tolerance (1e-4 in
/// float32) of the manual math on the device kind (kManual where no fused one wins). The table
/// and the numbers behind it: docs/bench/attention.md. Deterministic, no device query.
AttentionPath attention_path(c10::DeviceType device, at::ScalarType dtype, BiasKind bias,
                             int64_t tokens, int64_t head_dim);

/// The bias that `path` reads in place, so that a caller can build it once and reuse it (Swin
/// caches it per block): for kMemEfficient and kSdpaPaddedMask, `bias` (nW or 1, H or 1, Lq, Lk)
/// in `dtype` stored with rows padded to 16 elements and, when batch_windows > 0, replicated
/// image-major to (batch_windows, ...); pass it with bias_windows = batch_windows (or a leading
/// slice of it for fewer images). Other paths: `bias` unchanged (they read it without a
/// per-call copy). Bytes: batch_windows * H * Lq * 16-padded Lk * sizeof(dtype). Throws
/// c10::Error when bias is not 4-D or batch_windows is not a multiple of its windows.
at::Tensor prepare_attention_bias(const at::Tensor& bias, int64_t batch_windows,
                                  at::ScalarType dtype, AttentionPath path);

/// q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv); bias additive, broadcastable to
/// (B, H, Lq, Lk), or undefined. Returns (B, H, Lq, dv) in q's dtype, computed with `path`.
/// softmax_in_float32: softmax computed in float32 then cast back (ViT/Swin eager path).
/// bias_windows > 0: bias is a window bias (nW = bias_windows, shape (nW, H or 1, Lq, Lk)) and
/// B is a multiple of nW (image-major windows); the manual math then adds it without
/// materialising the (B, H, Lq, Lk) copy (byte-identical to adding the expanded bias).
/// kSdpaWindowBatch needs bias_windows > 0, kMemEfficient CUDA tensors and a float bias
/// (c10::Error otherwise).
at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& bias, double scale, AttentionPath path,
                                 bool softmax_in_float32 = false, int64_t bias_windows = 0);

/// The per-call scalars of the slot.
struct AttentionCall {
  double scale = 1.0;
  bool softmax_in_float32 = false;
  int64_t bias_windows = 0;
};

/// The slot's declaration: (q, k, v, bias, call) -> (B, H, Lq, dv), shapes above.
inline constexpr SlotDef<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& bias, const AttentionCall& call)>
    kAttention{"attention"};
using AttentionHandle = Handle<decltype(kAttention)::Signature>;

/// The model-facing entry point: with `fused` false the reference math (no slot call); with
/// `fused` true the model's bound `handle` (mem_efficient, sdpa, reference as the policy allows),
/// the reference when the handle is empty or every candidate declined. Throws c10::Error on
/// shapes that do not match.
at::Tensor attention(const AttentionHandle& handle, bool fused, const at::Tensor& q,
                     const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                     const AttentionCall& call);

}  // namespace libreyolo::kernels
