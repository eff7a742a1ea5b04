// LIBREYOLO_TARGET_CLONES: function multi-versioning for the CPU implementations' inner loops.
//
// A function marked with it is compiled for AVX-512, AVX2 and the baseline, and the loader picks
// one (GCC / Clang ifunc, target_clones). Without it a loop's vectorisation is left to the
// baseline's SSE2 and to GCC's heuristics: an unrelated edit of
// kernels/attention/cpu/ms_deform_attn_cpu.cpp once left its channel loops scalar (D-FINE L's
// bfloat16 forward 120 -> 140 ms on a 2-core AMX Xeon, 2026-12-05). Empty off x86-64 and in
// sanitizer builds (they test correctness, not speed; one version per function keeps their
// reports plain).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define LIBREYOLO_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LIBREYOLO_TARGET_CLONES
#endif
