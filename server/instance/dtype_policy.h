// Which dtype a model computes in when its serving.yaml leaves `dtype` unset: the server's
// top-level `dtype`, else a device rule. On CUDA float32 (as before; float16/bfloat16 are an
// operator's choice there, against the parity bars). On a CPU with native bf16 arithmetic
// (AVX-512 BF16, or AMX tiles, Intel Sapphire Rapids / AMD Zen 4 and later), bfloat16: oneDNN
// runs bf16 convolutions and matrix multiplications there at twice the float32 rate or more
// (RT-DETR on AMX: 4x float32 end to end, docs/BENCHMARKS.md). Without them bf16 is emulated,
// slower than float32, so float32 stays. No torch in this header.
#pragma once

#include <string>

namespace libreyolo::server {

/// The x86 features that make bf16 arithmetic native on the CPU (Linux /proc/cpuinfo flag names).
struct CpuBf16Flags {
  bool avx512_bf16 = false;  ///< VCVTNE2PS2BF16 / VDPBF16PS (Cooper Lake, Zen 4)
  bool amx_bf16 = false;     ///< TDPBF16PS on AMX tiles (Sapphire Rapids)
  bool amx_tile = false;     ///< the AMX tile registers themselves (amx_bf16 needs them)
};

/// The flags of the first "flags" line of `cpuinfo` (the text of /proc/cpuinfo). Why the file
/// and not cpuid: the kernel lists amx_tile / amx_bf16 only when it can enable the AMX state for
/// a process (Linux >= 5.16, XFEATURE_XTILEDATA), which cpuid does not say. Text without such a
/// line (another architecture, garbage, "") gives all false. Never throws.
CpuBf16Flags cpu_bf16_flags(const std::string& cpuinfo);

/// cpu_bf16_flags() of this machine's /proc/cpuinfo, read once per process (all false when it
/// cannot be read). Never throws.
const CpuBf16Flags& host_cpu_bf16_flags();

/// A model's compute dtype and why, as /active reports it.
struct DtypeChoice {
  std::string dtype;   ///< "float32" | "float16" | "bfloat16"
  std::string source;  ///< e.g. "cpu has amx_bf16", "serving.yaml repo/m/serving.yaml:1:8"
};

/// The dtype of one model instance:
/// - `serving_dtype` (serving.yaml `dtype`, "" when unset) wins, source "serving.yaml <origin>";
/// - else `server_dtype` (the top-level `dtype`) when it is not "auto": source "server dtype
///   <origin>" (origin "" for the default);
/// - else on CUDA (`cuda` true) "float32", source "default on cuda";
/// - else on the CPU "bfloat16" with source "cpu has amx_bf16" (amx_bf16 and amx_tile) or "cpu
///   has avx512_bf16", or "float32" with source "default on cpu (no avx512_bf16 or amx_bf16)".
/// Never throws (the dtype strings were checked when the files were read).
DtypeChoice choose_dtype(const std::string& serving_dtype, const std::string& serving_origin,
                         const std::string& server_dtype, const std::string& server_origin,
                         bool cuda, const CpuBf16Flags& cpu);

/// Whether a model instance decodes JPEGs on its GPU (server.gpu_image_decode) and why.
struct GpuImageDecodeChoice {
  bool on = false;
  std::string source;  ///< e.g. "default for cuda bfloat16", "server.gpu_image_decode s.yaml:3:21"
};

/// server.gpu_image_decode for one instance, from the setting ("auto" | "on" | "off"), its
/// origin ("" for the default), the instance's device and compute dtype:
/// - a CPU model never ("cpu model");
/// - "on" / "off" as set (source "server.gpu_image_decode <origin>");
/// - "auto": on in float16 / bfloat16 ("default for cuda bfloat16"), off in float32 ("default
///   for cuda float32: the CPU decoder keeps preprocessing exact"). nvJPEG's IDCT and chroma
///   upsampling move pixels by a few levels against libjpeg-turbo; byte-exact parity with the
///   reference is a float32 bar, so 16-bit models take the faster path, as fused attention's
///   default does (models/layers/attention.h fused_attention_by_default).
/// Never throws.
GpuImageDecodeChoice choose_gpu_image_decode(const std::string& setting, const std::string& origin,
                                             bool cuda, const std::string& dtype);

}  // namespace libreyolo::server
