#include "server/instance/dtype_policy.h"

#include <fstream>
#include <sstream>

namespace libreyolo::server {

CpuBf16Flags cpu_bf16_flags(const std::string& cpuinfo) {
  CpuBf16Flags f;
  try {
    std::istringstream lines(cpuinfo);
    for (std::string line; std::getline(lines, line);) {
      // x86: "flags\t\t: fpu vme ... amx_tile" (arch/x86/kernel/cpu/proc.c); every CPU lists
      // the same set, so the first line is enough.
      if (line.rfind("flags", 0) != 0) continue;
      const auto colon = line.find(':');
      if (colon == std::string::npos || line.find_first_not_of(" \t", 5) != colon) continue;
      std::istringstream words(line.substr(colon + 1));
      for (std::string w; words >> w;) {
        if (w == "avx512_bf16") f.avx512_bf16 = true;
        if (w == "amx_bf16") f.amx_bf16 = true;
        if (w == "amx_tile") f.amx_tile = true;
      }
      break;
    }
  } catch (...) {
    return CpuBf16Flags{};  // out of memory on a huge input: no native bf16 claimed
  }
  return f;
}

const CpuBf16Flags& host_cpu_bf16_flags() {
  static const CpuBf16Flags flags = [] {
    try {
      std::ifstream in("/proc/cpuinfo");
      std::ostringstream text;
      text << in.rdbuf();
      return cpu_bf16_flags(text.str());
    } catch (...) {
      return CpuBf16Flags{};
    }
  }();
  return flags;
}

DtypeChoice choose_dtype(const std::string& serving_dtype, const std::string& serving_origin,
                         const std::string& server_dtype, const std::string& server_origin,
                         bool cuda, const CpuBf16Flags& cpu) {
  if (!serving_dtype.empty()) return {serving_dtype, "serving.yaml " + serving_origin};
  if (!server_dtype.empty() && server_dtype != "auto") {
    return {server_dtype,
            server_origin.empty() ? std::string("server dtype") : "server dtype " + server_origin};
  }
  if (cuda) return {"float32", "default on cuda"};
  if (cpu.amx_bf16 && cpu.amx_tile) return {"bfloat16", "cpu has amx_bf16"};
  if (cpu.avx512_bf16) return {"bfloat16", "cpu has avx512_bf16"};
  return {"float32", "default on cpu (no avx512_bf16 or amx_bf16)"};
}

GpuImageDecodeChoice choose_gpu_image_decode(const std::string& setting, const std::string& origin,
                                             bool cuda, const std::string& dtype) {
  if (!cuda) return {false, "cpu model"};
  if (setting == "on" || setting == "off") {
    return {setting == "on", origin.empty() ? std::string("server.gpu_image_decode")
                                            : "server.gpu_image_decode " + origin};
  }
  if (dtype == "float32")
    return {false, "default for cuda float32: the CPU decoder keeps preprocessing exact"};
  return {true, "default for cuda " + dtype};
}

}  // namespace libreyolo::server
