// The CPU floating-point environment of the threads that run forwards: MKL VML's one-time
// start, and denormals flushed to zero. Torch-free header.
#pragma once

namespace libreyolo::models {

/// Makes ATen's first call into MKL's vector math library (VML) on the calling thread, alone.
///
/// Why: ATen computes float tanh, erf, exp, log and others on the CPU with MKL VML
/// (aten/src/ATen/cpu/vml.h, vmsTanh with VML_HA) and MKL initialises VML lazily, on its
/// first call. When two OpenMP threads make that first call together (a model's first tanh on
/// a tensor large enough to be split), one thread's half came out of a less accurate path:
/// tests/unit/linear_act_onednn_test.cpp saw 2,982 of 7,104 tanh outputs saturated to -1 where
/// the answer is -0.999909 (input -5.0006), in 7 of 60 processes with 2 threads; none of 210
/// after one single-threaded call. models::load_model calls it (models/load_model.cpp), so every
/// program that runs a model has made the call before its first forward; a process without MKL
/// is unaffected. Idempotent, never throws.
void initialise_cpu_math() noexcept;

/// Whether a CPU forward in `dtype` runs with denormals flushed to zero by default: for
/// bfloat16 and float16 models (the values below 2^-126 that flushing changes are far under
/// their rounding, and their parity bar is a tolerance), not for float32 ones, which keep IEEE
/// arithmetic and with it the byte-exact parity with transformers (as fused attention,
/// models/layers/attention.h fused_attention_by_default). `dtype` is a c10::ScalarType value.
bool flush_denormals_by_default(int dtype) noexcept;

/// Sets flush-to-zero and denormals-are-zero (x86 MXCSR FTZ and DAZ) on the calling thread and
/// on each thread of its OpenMP team (one parallel region of at::get_num_threads() single-item
/// chunks), the threads ATen, oneDNN and MKL run this thread's operators on. MXCSR is per
/// thread, and libgomp gives each thread that opens a parallel region a team of its own, so
/// this changes nothing for other threads; new team threads inherit it from the caller.
///
/// Why: x86 takes a microcode assist, about 100x the cycles, for each float operation on a
/// denormal input or result. A random-weight RT-DETR-R18's encoder output (|x| <= 7e-13, 18%
/// of it below 1.1e-19, whose squares are denormal) made its 8400x256 bfloat16 LayerNorm take
/// 2.65 ms instead of 0.6 (libreyolo-bench-models --profile); softmax and sigmoid tails produce
/// denormals in trained models too. TensorFlow runs its ops with FTZ + DAZ; ONNX Runtime
/// (session.set_denormal_as_zero) and OpenVINO (CPU denormals_optimization) offer it.
///
/// Returns false where the CPU has no such control (not x86-64): nothing changed. Never throws.
bool flush_denormals_on_this_thread() noexcept;

}  // namespace libreyolo::models
