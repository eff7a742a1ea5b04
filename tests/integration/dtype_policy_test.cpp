// The dtype policy (server/instance/dtype_policy.h): the bf16 CPU flags read from /proc/cpuinfo
// text, the decision with fake flag sets, this machine's flags against ATen's cpuinfo, and the
// daemon's /active saying which dtype each model computes in and why. The policy-chosen bf16
// case needs a CPU with AVX-512 BF16 or AMX and skips elsewhere; an explicit `dtype: bfloat16`
// on the CPU runs everywhere (emulated where the CPU lacks the instructions).
#include "server/instance/dtype_policy.h"

#include <ATen/cpu/Utils.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/kernels.h"
#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/config/serving_config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using nlohmann::json;

/// The flags set, by their /proc/cpuinfo names ("" for none).
std::string names(const CpuBf16Flags& f) {
  std::string s = f.avx512_bf16 ? "avx512_bf16 " : "";
  if (f.amx_bf16) s += "amx_bf16 ";
  if (f.amx_tile) s += "amx_tile ";
  return s.empty() ? s : s.substr(0, s.size() - 1);
}

// Excerpts of real /proc/cpuinfo flags lines (Linux 6.x).
const std::string kSapphireRapids =
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 "
    "wbnoinvd avx512vbmi avx512_vp2intersect amx_bf16 avx512_fp16 amx_tile amx_int8\n"
    "vmx flags\t: vnmi preemption_timer\nbugs\t\t: spectre_v1\n";
const std::string kZen4 =
    "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    "flags\t\t: fpu sse2 avx avx2 avx512f avx512dq avx512_bf16 clzero avx512vbmi\n";
const std::string kZen3 =
    "processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
    "flags\t\t: fpu vme sse sse2 avx f16c avx2 fma bmi2 sha_ni clzero\n";

TEST(CpuBf16Flags, FromCpuinfoText) {
  EXPECT_EQ(names(cpu_bf16_flags(kSapphireRapids)), "avx512_bf16 amx_bf16 amx_tile");
  EXPECT_EQ(names(cpu_bf16_flags(kZen4)), "avx512_bf16");
  EXPECT_EQ(names(cpu_bf16_flags(kZen3)), "");
  // aarch64 says "Features" (its bf16 is not an x86 flag), garbage and "" say nothing.
  EXPECT_EQ(names(cpu_bf16_flags("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")), "");
  EXPECT_EQ(names(cpu_bf16_flags("")), "");
  EXPECT_EQ(names(cpu_bf16_flags(std::string("\0\xff amx_bf16 amx_tile\n:::", 23))), "");
  // Only a line whose key is exactly "flags", and only the first one.
  EXPECT_EQ(names(cpu_bf16_flags("flagsx\t: avx512_bf16\nvmx flags\t: amx_bf16\n")), "");
  EXPECT_EQ(names(cpu_bf16_flags("flags: avx2\nflags: avx512_bf16\n")), "");
  EXPECT_EQ(names(cpu_bf16_flags("flags : amx_tile")), "amx_tile");
}

TEST(ChooseDtype, ExplicitSettingsWinThenTheDeviceRule) {
  const CpuBf16Flags amx{true, true, true}, avx512{true, false, false}, none{};
  auto choose = [](const std::string& serving, const std::string& server, bool cuda,
                   const CpuBf16Flags& cpu) {
    const DtypeChoice c = choose_dtype(serving, serving.empty() ? "" : "m/serving.yaml:1:8", server,
                                       server == "auto" ? "" : "s.yaml:1:8", cuda, cpu);
    return c.dtype + " | " + c.source;
  };
  // An operator's float32 always wins, on every CPU (the parity rule).
  EXPECT_EQ(choose("float32", "auto", false, amx), "float32 | serving.yaml m/serving.yaml:1:8");
  EXPECT_EQ(choose("float32", "bfloat16", false, amx), "float32 | serving.yaml m/serving.yaml:1:8");
  EXPECT_EQ(choose("", "float32", false, amx), "float32 | server dtype s.yaml:1:8");
  EXPECT_EQ(choose("float16", "auto", true, none), "float16 | serving.yaml m/serving.yaml:1:8");
  EXPECT_EQ(choose("", "bfloat16", false, none), "bfloat16 | server dtype s.yaml:1:8");
  // auto: the device rule.
  EXPECT_EQ(choose("", "auto", false, amx), "bfloat16 | cpu has amx_bf16");
  EXPECT_EQ(choose("", "auto", false, avx512), "bfloat16 | cpu has avx512_bf16");
  EXPECT_EQ(choose("", "auto", false, CpuBf16Flags{true, true, false}),
            "bfloat16 | cpu has avx512_bf16");  // amx_bf16 without its tiles is no AMX
  EXPECT_EQ(choose("", "auto", false, CpuBf16Flags{false, true, false}),
            "float32 | default on cpu (no avx512_bf16 or amx_bf16)");
  EXPECT_EQ(choose("", "auto", false, none),
            "float32 | default on cpu (no avx512_bf16 or amx_bf16)");
  EXPECT_EQ(choose("", "auto", true, amx), "float32 | default on cuda");
  EXPECT_EQ(choose_dtype("", "", "", "", false, none).dtype, "float32");
  EXPECT_EQ(choose_dtype("", "", "float32", "", false, amx).source, "server dtype");
}

// server.gpu_image_decode per instance: auto follows the dtype on CUDA, an explicit value wins
// there, and a CPU model never decodes on a GPU.
TEST(GpuImageDecodePolicy, AutoIsOnForSixteenBitCudaModels) {
  const auto choose = [](const std::string& setting, const std::string& origin, bool cuda,
                         const std::string& dtype) {
    const auto c = choose_gpu_image_decode(setting, origin, cuda, dtype);
    return std::string(c.on ? "on" : "off") + " | " + c.source;
  };
  EXPECT_EQ(choose("auto", "", true, "bfloat16"), "on | default for cuda bfloat16");
  EXPECT_EQ(choose("auto", "", true, "float16"), "on | default for cuda float16");
  EXPECT_EQ(choose("auto", "", true, "float32"),
            "off | default for cuda float32: the CPU decoder keeps preprocessing exact");
  EXPECT_EQ(choose("on", "s.yaml:3:21", true, "float32"),
            "on | server.gpu_image_decode s.yaml:3:21");
  EXPECT_EQ(choose("off", "s.yaml:3:21", true, "bfloat16"),
            "off | server.gpu_image_decode s.yaml:3:21");
  EXPECT_EQ(choose("on", "", true, "float32"), "on | server.gpu_image_decode");
  EXPECT_EQ(choose("on", "s.yaml:3:21", false, "bfloat16"), "off | cpu model");
  EXPECT_EQ(choose("auto", "", false, "bfloat16"), "off | cpu model");
}

/// ATen's bool for a cpuinfo capability (false when it does not list it).
bool aten_has(const std::string& key) {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto it = caps.find(key);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

/// This machine: what /proc/cpuinfo lists, the CPU has (ATen's cpuinfo reads cpuid); without
/// the flags float32 stays the default (CI's and the development machines' AVX2 CPUs).
TEST(ChooseDtype, ThisCpu) {
  const CpuBf16Flags host = host_cpu_bf16_flags();
  std::cout << "[dtype] /proc/cpuinfo {" << names(host) << "}, ATen cpuinfo:";
  for (const auto& [key, value] : at::cpu::get_cpu_capabilities())
    if (key.find("bf16") != std::string::npos || key.find("amx") != std::string::npos)
      std::cout << " " << key << "=" << value;
  std::cout << std::endl;
  if (host.avx512_bf16) EXPECT_TRUE(aten_has("avx512_bf16"));
  if (host.amx_bf16) EXPECT_TRUE(aten_has("amx_bf16"));
  if (host.avx512_bf16 || (host.amx_bf16 && host.amx_tile))
    GTEST_SKIP() << "this CPU has native bf16 {" << names(host) << "}: BF16CpuByPolicy covers it";
  const DtypeChoice c = choose_dtype("", "", "auto", "", false, host);
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.source, "default on cpu (no avx512_bf16 or amx_bf16)");
}

TEST(ServingDtype, UnsetIsEmptyAndTheKeyKeepsItsOrigin) {
  EXPECT_EQ(parse_serving_config("", "m/serving.yaml").dtype, "");
  const auto s = parse_serving_config("max_batch_size: 2\ndtype: bfloat16\n", "m/serving.yaml");
  EXPECT_EQ(s.dtype, "bfloat16");
  EXPECT_EQ(s.dtype_origin, "m/serving.yaml:2:8");
}

TEST(ServerDtype, TopLevelKey) {
  const auto error = config_error;
  EXPECT_EQ(error("dtype: float64\n"),
            "bad.yaml:1:8: dtype must be auto, float32, float16 or bfloat16, got 'float64'");
  EXPECT_EQ(error("dtype: [a]\n"),
            "bad.yaml:1:8: dtype must be auto, float32, float16 or bfloat16");
  const auto c = parse_config("dtype: bfloat16\n", "ok.yaml", {}, {});
  EXPECT_EQ(c.dtype.value, "bfloat16");
  EXPECT_EQ(c.dtype.origin, "ok.yaml:1:8");
  EXPECT_EQ(parse_config("", "ok.yaml", {}, {}).dtype.value, "auto");
  const auto shipped =
      load_config(std::string(LIBREYOLO_SOURCE_DIR) + "/config/server.yaml", {}, {});
  EXPECT_EQ(shipped.dtype.value, "auto");
  EXPECT_EQ(shipped.dtype.source, Source::file);
  EXPECT_NE(describe(c).find("\ndtype: bfloat16  # ok.yaml:1:8\n"), std::string::npos)
      << describe(c);
}

json model_entry(const json& active, const std::string& name) {
  for (const auto& m : active.at("models"))
    if (m.at("name") == name) return m;
  return json();
}

bool host_has_bf16() {
  const auto& f = host_cpu_bf16_flags();
  return f.avx512_bf16 || (f.amx_bf16 && f.amx_tile);
}

/// /active per model: serving.yaml's dtype wins over the server's `dtype: auto`, the server's
/// float32 over the device rule; and on a CPU without native bf16, an unset dtype is float32.
TEST(ServerDtype, ActiveSaysWhichDtypeAndWhy) {
  const auto repo = temp_dir("dtype");
  add_fake_model(repo, "fake_unset", "");
  add_fake_model(repo, "fake_f32", "dtype: float32\n");
  add_fake_model(repo, "fake_bf16", "max_batch_size: 1\ndtype: bfloat16\n");
  const std::string yaml = (repo / "fake_bf16/serving.yaml").string();
  {
    Daemon d(loopback_config(repo, "cpu", "dtype: auto\n"), fake_or_real());
    d.start();
    const auto active = json::parse(http_get(d.http_port(), "/active").body);
    EXPECT_EQ(active.at("server").at("dtype"),
              (json{{"value", "auto"}, {"source", "file"}, {"origin", "test.yaml:1:8"}}));
    EXPECT_EQ(
        model_entry(active, "fake_f32").at("dtype"),
        (json{{"value", "float32"},
              {"source", "serving.yaml " + (repo / "fake_f32/serving.yaml").string() + ":1:8"}}));
    EXPECT_EQ(model_entry(active, "fake_bf16").at("dtype"),
              (json{{"value", "bfloat16"}, {"source", "serving.yaml " + yaml + ":2:8"}}));
    const auto unset = model_entry(active, "fake_unset").at("dtype");
    if (!host_has_bf16())
      EXPECT_EQ(unset, (json{{"value", "float32"},
                             {"source", "default on cpu (no avx512_bf16 or amx_bf16)"}}));
    EXPECT_EQ(d.core().model_config("fake_bf16", "").parameters.at("dtype_source"),
              "serving.yaml " + yaml + ":2:8");
    d.stop(1.0);
  }
  {
    Daemon d(loopback_config(repo, "cpu", "dtype: float32\n"), fake_or_real());
    d.start();
    const auto active = json::parse(http_get(d.http_port(), "/active").body);
    EXPECT_EQ(model_entry(active, "fake_unset").at("dtype"),
              (json{{"value", "float32"}, {"source", "server dtype test.yaml:1:8"}}));
    d.stop(1.0);
  }
  remove_tree(repo);
}

/// The 10 best scores (threshold 0: sorted, every query) RT-DETR tiny `model` gives the fixture's
/// first image at 320x320 (every second pixel: bf16 is emulated on CPUs without AVX-512 BF16,
/// CI's, at a tenth of float32's speed).
std::vector<float> best_scores(rpc::Client& c, const std::string& model) {
  const auto expected = models::core::SafetensorsFile::open(
      std::string(LIBREYOLO_TEST_FIXTURES) + "/models/rtdetr_tiny/expected.safetensors");
  const auto u8 = expected->get("pixel_u8", at::kFloat, at::kCPU).slice(0, 0, 1);
  auto pv = (u8.slice(2, 0, 640, 2).slice(3, 0, 640, 2) * 0.00392156862745098f).contiguous();
  const std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
  const auto r =
      c.infer("model_name: \"" + model +
                  "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 320, 320] } "
                  "parameters { key: \"threshold\" value { double_param: 0.0 } }",
              {raw});
  EXPECT_TRUE(r.ok()) << model << ": " << r.message;
  if (!r.ok()) return {};
  const int64_t count = values<int32_t>(r.output("num_detections").data).at(0);
  auto scores = values<float>(r.output("scores").data);
  scores.resize(std::min<int64_t>(count, 10));
  return scores;
}

/// max |a - b| over two equally long score lists (1e9 when the lengths differ or are 0).
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 1e9;
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << i;
    d = std::max(d, std::abs(double(a[i]) - b[i]));
  }
  return d;
}

/// Adds RT-DETR tiny as <repo>/<name> with `serving_yaml` (no warm-up: cheaper).
void add_rtdetr(const fs::path& repo, const std::string& name, const std::string& serving_yaml) {
  add_rtdetr_tiny(repo, serving_yaml + "warmup: false\n");
  fs::rename(repo / "rtdetr_tiny", repo / name);
}

/// The CPU bf16 path an operator asks for (runs on every CPU; emulated without AVX-512 BF16):
/// the batch is converted to bfloat16 and the scores come back near the float32 model's.
TEST(ServerDtype, ExplicitBfloat16ServesOnTheCpu) {
  const auto repo = temp_dir("dtype_bf16");
  add_rtdetr(repo, "rtdetr_f32", "dtype: float32\n");
  add_rtdetr(repo, "rtdetr_bf16", "dtype: bfloat16\n");
  {
    Daemon d(loopback_config(repo, "cpu"));
    d.start();
    ASSERT_TRUE(d.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
    const auto f32 = best_scores(c, "rtdetr_f32"), bf16 = best_scores(c, "rtdetr_bf16");
    const double ds = max_diff(bf16, f32);
    std::cout << "[dtype] rtdetr_tiny 320x320 on cpu: max |bf16 - fp32| over the 10 best scores = "
              << ds << std::endl;
    EXPECT_EQ(f32.size(), 10u);
    EXPECT_LE(ds, 0.02);  // measured 0.0010 (docs/BENCHMARKS.md); bf16 keeps 8 mantissa bits
    d.stop(1.0);
  }
  remove_tree(repo);
}

/// bf16 chosen by policy (dtype unset, server dtype auto) on a CPU with AVX-512 BF16 or AMX.
TEST(ServerDtype, BF16CpuByPolicy) {
  if (!host_has_bf16())
    GTEST_SKIP() << "this CPU has neither avx512_bf16 nor amx_bf16 (/proc/cpuinfo bf16 flags: {"
                 << names(host_cpu_bf16_flags())
                 << "}): float32 stays the default here (ActiveSaysWhichDtypeAndWhy), the bf16 "
                    "CPU path chosen by policy is unmeasured";
  const auto repo = temp_dir("dtype_policy_bf16");
  add_rtdetr(repo, "rtdetr_f32", "dtype: float32\n");
  add_rtdetr(repo, "rtdetr_unset", "");
  {
    Daemon d(loopback_config(repo, "cpu", "dtype: auto\n"));
    d.start();
    ASSERT_TRUE(d.core().ready());
    const auto active = json::parse(http_get(d.http_port(), "/active").body);
    const auto& f = host_cpu_bf16_flags();
    EXPECT_EQ(
        model_entry(active, "rtdetr_unset").at("dtype"),
        (json{{"value", "bfloat16"},
              {"source", f.amx_bf16 && f.amx_tile ? "cpu has amx_bf16" : "cpu has avx512_bf16"}}));
    EXPECT_EQ(model_entry(active, "rtdetr_f32").at("dtype").at("value"), "float32");
    rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
    const double ds = max_diff(best_scores(c, "rtdetr_unset"), best_scores(c, "rtdetr_f32"));
    std::cout << "[dtype] rtdetr_tiny 320x320, bf16 by policy: max |bf16 - fp32| over the 10 best "
                 "scores = "
              << ds << std::endl;
    EXPECT_LE(ds, 0.05);
    d.stop(1.0);
  }
  remove_tree(repo);
}

/// serving.yaml `quantization: fp8` (models/quantization/fp8.h) on a CPU model: no fp8_gemm
/// implementation serves it, so the model computes as without the key, and /active says what
/// was asked, where, and why it is off; a value other than none / fp8 fails the load naming it.
TEST(ServerQuantization, Fp8OnTheCpuStaysOffAndSaysWhy) {
  const auto repo = temp_dir("quantization");
  add_rtdetr(repo, "rtdetr_f32", "");
  add_rtdetr(repo, "rtdetr_fp8", "quantization: fp8\n");
  add_rtdetr(repo, "rtdetr_int8", "quantization: int8\n");
  const std::string yaml = (repo / "rtdetr_fp8/serving.yaml").string();
  {
    Daemon d(loopback_config(repo, "cpu"));
    d.start();
    const auto active = json::parse(http_get(d.http_port(), "/active").body);
    // With the cuda provider loaded (a GPU machine) `scaled_mm` is a candidate that declines
    // CPU models; without a GPU nothing is registered for the slot.
    const bool cuda = kernels::built_with_cuda() && at::hasCUDA();
    const std::string why = cuda ? "scaled_mm: the model is not on a CUDA device"
                                 : "no fp8_gemm implementation in this process (scaled_mm comes "
                                   "with the cuda provider)";
    EXPECT_EQ(model_entry(active, "rtdetr_fp8").at("quantization"),
              (json{{"value", "fp8"},
                    {"source", "serving.yaml " + yaml + ":1:15"},
                    {"status", "off: " + why},
                    {"implementation", ""},
                    {"layers", 0}}));
    EXPECT_EQ(model_entry(active, "rtdetr_f32").at("quantization"), (json{{"value", "none"},
                                                                          {"source", "default"},
                                                                          {"status", "none"},
                                                                          {"implementation", ""},
                                                                          {"layers", 0}}));
    EXPECT_EQ(model_entry(active, "rtdetr_int8").at("state"), "UNAVAILABLE");
    EXPECT_EQ(model_entry(active, "rtdetr_int8").at("reason"),
              (repo / "rtdetr_int8/serving.yaml").string() +
                  ":1:15: quantization must be none or fp8, got 'int8'");
    rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
    const auto f32 = best_scores(c, "rtdetr_f32"), fp8 = best_scores(c, "rtdetr_fp8");
    EXPECT_EQ(f32.size(), 10u);
    EXPECT_EQ(f32, fp8);  // nothing was quantised: the same numbers
    d.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
