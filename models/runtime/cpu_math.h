// One-time initialisation of ATen's CPU math library before any parallel operator runs.
// Torch-free header.
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
/// after one single-threaded call. The daemon calls this once at start-up (server/core/core.cpp),
/// before any model loads; a process without MKL is unaffected. Idempotent, never throws.
void initialise_cpu_math() noexcept;

}  // namespace libreyolo::models
