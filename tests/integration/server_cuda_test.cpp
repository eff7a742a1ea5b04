// The daemon serving on a GPU: the fixture detections on CUDA, eager and replayed from CUDA
// graphs (serving.yaml `cuda_graphs: on`), and /active proving which implementation ran (the
// in-tree `cuda` ms_deform_attn, no fallback). The CUDA cases skip without a device; the CPU
// case (cuda_graphs ignored on a CPU model, with the reason in /active) runs everywhere.
#include <gtest/gtest.h>

#include <future>

#include <nlohmann/json.hpp>

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

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

json model_entry(const json& active, const std::string& name) {
  for (const auto& m : active.at("models"))
    if (m.at("name") == name) return m;
  return json();
}

/// ModelInfer with the fixture's exact pixels (2 images) as pixel_values + target_sizes;
/// returns the max |score| and |box| differences from transformers' detections at 0.3.
std::pair<double, double> fixture_diffs(rpc::Client& c, const std::string& model) {
  const auto expected =
      models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
  auto pv = (expected->get("pixel_u8", at::kFloat, at::kCPU) * 0.00392156862745098f).contiguous();
  const std::string raw(reinterpret_cast<const char*>(pv.data_ptr<float>()), pv.numel() * 4);
  const std::vector<int64_t> sizes = {512, 512, 400, 600};
  const std::string raw_sizes(reinterpret_cast<const char*>(sizes.data()), sizes.size() * 8);
  const auto r =
      c.infer("model_name: \"" + model +
                  "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [2, 3, 640, 640] } "
                  "inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [2, 2] } "
                  "parameters { key: \"threshold\" value { double_param: 0.3 } }",
              {raw, raw_sizes});
  EXPECT_TRUE(r.ok()) << model << ": " << r.message;
  if (!r.ok()) return {1e9, 1e9};
  const auto counts = values<int32_t>(r.output("num_detections").data);
  const int64_t k = r.output("scores").shape.at(1);
  const auto scores = values<float>(r.output("scores").data);
  const auto labels = values<int64_t>(r.output("labels").data);
  const auto boxes = values<float>(r.output("boxes").data);
  double ds = 0, db = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "th0.3_img" + std::to_string(i) + "_";
    auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
    auto el = expected->get(p + "labels", at::kLong, at::kCPU);
    auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
    EXPECT_EQ(counts.at(i), es.size(0)) << model << " image " << i;
    for (int64_t j = 0; j < std::min<int64_t>(counts.at(i), es.size(0)); ++j) {
      ds = std::max(ds, std::abs(double(scores[i * k + j]) - es[j].item<float>()));
      EXPECT_EQ(labels[i * k + j], el[j].item<int64_t>()) << model;
      for (int q = 0; q < 4; ++q)
        db = std::max(db, std::abs(double(boxes[(i * k + j) * 4 + q]) - eb[j][q].item<float>()));
    }
  }
  return {ds, db};
}

TEST(ServerCuda, DetectionsEagerAndFromCudaGraphsWithTheCudaKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto repo = temp_dir("cuda_repo");
  add_rtdetr_tiny(repo, "device: cuda\nmax_batch_size: 4\n");
  fs::rename(repo / "rtdetr_tiny", repo / "rtdetr_eager");
  add_rtdetr_tiny(repo, "device: cuda\nmax_batch_size: 4\ncuda_graphs: on\n");
  fs::rename(repo / "rtdetr_tiny", repo / "rtdetr_graphs");
  {
    auto config = loopback_config(repo, "cuda");
    config.tf32.value = "off";  // the reference is float32 without TF32
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()));
    for (const std::string model : {"rtdetr_eager", "rtdetr_graphs"}) {
      const auto [ds, db] = fixture_diffs(c, model);
      std::cout << "[gpu] " << model << ": max |score - expected| = " << ds
                << ", max |box - expected| = " << db << " px" << std::endl;
      EXPECT_LE(ds, 1e-4) << model;
      EXPECT_LE(db, 1e-2) << model;
    }
    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    EXPECT_EQ(model_entry(active, "rtdetr_graphs").at("cuda_graphs"), "on: batch sizes 1,2,4");
    EXPECT_EQ(model_entry(active, "rtdetr_eager").at("cuda_graphs"), "off");
    EXPECT_EQ(model_entry(active, "rtdetr_eager").at("device"), "cuda:0");
    EXPECT_EQ(active.at("torch").at("allow_tf32_cudnn"), false);
    const auto& slot = active.at("slots").at("ms_deform_attn");
    if (slot.at("selected") == "cuda") {
      uint64_t calls = 0;
      for (const auto& cand : slot.at("candidates"))
        if (cand.at("name") == "cuda") {
          calls = cand.at("calls").get<uint64_t>();
          EXPECT_FALSE(cand.at("disabled").get<bool>());
        }
      EXPECT_GT(calls, 0u) << "the served models did not call ms_deform_attn/cuda";
    } else {
      std::cout << "[gpu] ms_deform_attn selected " << slot.at("selected")
                << " (policy): cuda calls not checked" << std::endl;
    }
    for (const auto& ev : active.at("fallback_events"))
      EXPECT_NE(ev.at("slot"), "ms_deform_attn") << ev.dump();
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

/// The fused-attention device rule (models::layers::fused_attention_by_default): a bfloat16
/// CUDA model gets SDPA with nothing configured, and /active says why; a float32 one keeps the
/// family's measured default (the manual math).
TEST(ServerCuda, SixteenBitCudaModelsGetFusedAttentionByDefault) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto repo = temp_dir("cuda_fused_repo");
  add_rtdetr_tiny(repo, "device: cuda\ndtype: bfloat16\n");
  fs::rename(repo / "rtdetr_tiny", repo / "rtdetr_bf16");
  add_rtdetr_tiny(repo, "device: cuda\n");
  fs::rename(repo / "rtdetr_tiny", repo / "rtdetr_fp32");
  {
    Daemon daemon(loopback_config(repo, "cuda"));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    const auto bf16 = model_entry(active, "rtdetr_bf16").at("fused_attention");
    EXPECT_EQ(bf16.at("value"), "on");
    EXPECT_EQ(bf16.at("source"), "default for cuda:0 bfloat16 (float32 keeps the family default)");
    EXPECT_GT(bf16.at("modules_changed").get<int>(), 0);
    const auto fp32 = model_entry(active, "rtdetr_fp32").at("fused_attention");
    EXPECT_EQ(fp32.at("value"), "default");
    EXPECT_EQ(fp32.at("source"), "family default");
    EXPECT_EQ(fp32.at("modules_changed"), 0);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

/// Two instances on cuda:0 (instance_group KIND_GPU): each has its own weights, stream and CUDA
/// graphs; concurrent requests run on both and their detections equal transformers'.
TEST(ServerCuda, TwoInstancesOnOneGpuBothServeTheFixture) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto repo = temp_dir("cuda_instances");
  add_rtdetr_tiny(repo,
                  "max_batch_size: 2\ncuda_graphs: on\n"
                  "instance_group: [{count: 2, kind: KIND_GPU, gpus: [0]}]\n");
  {
    auto config = loopback_config(repo, "cuda");
    config.tf32.value = "off";
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    std::vector<std::future<std::pair<double, double>>> calls;
    for (int i = 0; i < 16; ++i)
      calls.push_back(std::async(std::launch::async, [&] {
        rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()));
        return fixture_diffs(c, "rtdetr_tiny");
      }));
    for (auto& f : calls) {
      const auto [ds, db] = f.get();
      EXPECT_LE(ds, 1e-4);
      EXPECT_LE(db, 1e-2);
    }
    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    const json entry = model_entry(active, "rtdetr_tiny");  // by value: keep it alive
    const auto& inst = entry.at("instances");
    ASSERT_EQ(inst.size(), 2u);
    std::uint64_t batches = 0;
    for (const auto& st : inst) {
      EXPECT_EQ(st.at("device"), "cuda:0");
      EXPECT_EQ(st.at("healthy"), true);
      batches += st.at("batches").get<std::uint64_t>();
      std::cout << "[gpu] " << st.at("name") << ": " << st.at("batches") << " batches" << std::endl;
    }
    EXPECT_GE(batches, 8u);  // 16 requests of 2 images, max_batch_size 2
    EXPECT_GT(inst[0].at("batches").get<std::uint64_t>(), 0u);
    EXPECT_GT(inst[1].at("batches").get<std::uint64_t>(), 0u);
    // Each instance bound its own handles, reported under its name.
    EXPECT_TRUE(active.at("bindings").contains("rtdetr_tiny_0")) << active.at("bindings").dump();
    EXPECT_TRUE(active.at("bindings").contains("rtdetr_tiny_1"));
    // GPU memory of the one device both instances use: read once, the weights in it.
    const auto& gpus = active.at("gpu_memory");
    ASSERT_EQ(gpus.size(), 1u) << gpus.dump();
    EXPECT_EQ(gpus[0].at("device"), "cuda:0");
    const auto total = gpus[0].at("total_bytes").get<std::uint64_t>();
    const auto used = gpus[0].at("used_bytes").get<std::uint64_t>();
    const auto reserved = gpus[0].at("reserved_bytes").get<std::uint64_t>();
    const auto allocated = gpus[0].at("allocated_bytes").get<std::uint64_t>();
    EXPECT_GT(allocated, 0u);
    EXPECT_GE(reserved, allocated);
    EXPECT_GE(used, reserved);
    EXPECT_GE(total, used);
    const auto metrics = http_get(daemon.http_port(), "/metrics").body;
    EXPECT_NE(metrics.find("libreyolo_gpu_memory_total_bytes{device=\"cuda:0\"} "),
              std::string::npos);
    EXPECT_NE(metrics.find("libreyolo_gpu_memory_allocated_bytes{device=\"cuda:0\"} "),
              std::string::npos);
    // Each instance's batches took device time (CUDA events), and no more than the host measured
    // for them: a batch's span on the stream lies inside its launch-to-read interval
    // (compute_seconds), so a unit slip (milliseconds as seconds) fails here.
    const auto series = [&](const std::string& name, const std::string& instance) {
      const std::string key =
          name + "{device=\"cuda:0\",instance=\"" + instance + "\",model=\"rtdetr_tiny\"} ";
      const auto at = metrics.find(key);
      return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + key.size()));
    };
    for (const std::string name : {"rtdetr_tiny_0", "rtdetr_tiny_1"}) {
      const double device = series("libreyolo_instance_device_seconds_total", name);
      const double compute = series("libreyolo_instance_compute_seconds_total", name);
      ASSERT_GT(device, 0.0) << name << " (-1: no series)\n" << metrics;
      ASSERT_GT(compute, 0.0) << name;
      EXPECT_LE(device, compute + 1e-4) << name;
      // and not a thousandth of it (seconds read as milliseconds): the forward is GPU work.
      EXPECT_GT(device, compute / 1000) << name;
    }
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

TEST(ServerCuda, ServingYamlCudaGraphsKey) {
  EXPECT_FALSE(parse_serving_config("", "m/serving.yaml").cuda_graphs);
  EXPECT_TRUE(parse_serving_config("cuda_graphs: on\n", "m/serving.yaml").cuda_graphs);
  EXPECT_TRUE(parse_serving_config("cuda_graphs: true\n", "m/serving.yaml").cuda_graphs);
  EXPECT_FALSE(parse_serving_config("cuda_graphs: off\n", "m/serving.yaml").cuda_graphs);
  try {
    parse_serving_config("max_batch_size: 4\ncuda_graphs: maybe\n", "m/serving.yaml");
    FAIL() << "cuda_graphs: maybe was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "m/serving.yaml:2:14: cuda_graphs must be on or off, got 'maybe'");
  }
}

TEST(ServerCuda, Tf32SettingParsesAndIsReported) {
  const kernels::Environment env{{"LIBREYOLO_HUB_KERNELS", "0"}};
  EXPECT_EQ(parse_config("", "s.yaml", {}, env).tf32.value, "default");
  EXPECT_EQ(parse_config("tf32: off\n", "s.yaml", {}, env).tf32.value, "off");
  EXPECT_EQ(parse_config("tf32: on\n", "s.yaml", {}, env).tf32.value, "on");
  EXPECT_EQ(parse_config("tf32: on\n", "s.yaml", {}, env).tf32.origin, "s.yaml:1:7");
  try {
    parse_config("device: cpu\ntf32: fast\n", "s.yaml", {}, env);
    FAIL() << "tf32: fast was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "s.yaml:2:7: tf32 must be default, on or off, got 'fast'");
  }
  EXPECT_NE(
      describe(parse_config("tf32: off\n", "s.yaml", {}, env)).find("tf32: off  # s.yaml:1:7"),
      std::string::npos);
}

TEST(ServerCuda, CudnnBenchmarkSettingParsesAndIsReported) {
  const kernels::Environment env{{"LIBREYOLO_HUB_KERNELS", "0"}};
  EXPECT_TRUE(parse_config("", "s.yaml", {}, env).cudnn_benchmark.value);
  EXPECT_FALSE(parse_config("cudnn_benchmark: off\n", "s.yaml", {}, env).cudnn_benchmark.value);
  EXPECT_FALSE(parse_config("cudnn_benchmark: false\n", "s.yaml", {}, env).cudnn_benchmark.value);
  EXPECT_EQ(parse_config("cudnn_benchmark: on\n", "s.yaml", {}, env).cudnn_benchmark.origin,
            "s.yaml:1:18");
  try {
    parse_config("device: cpu\ncudnn_benchmark: fast\n", "s.yaml", {}, env);
    FAIL() << "cudnn_benchmark: fast was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "s.yaml:2:18: cudnn_benchmark must be true or false, got 'fast'");
  }
  EXPECT_NE(describe(parse_config("cudnn_benchmark: off\n", "s.yaml", {}, env))
                .find("cudnn_benchmark: false  # s.yaml:1:18"),
            std::string::npos);
}

TEST(ServerCuda, CudaGraphsOnACpuModelAreIgnoredWithTheReason) {
  const auto repo = temp_dir("cpu_graphs_repo");
  add_rtdetr_tiny(repo, "device: cpu\ncuda_graphs: on\nwarmup: false\n");
  {
    Daemon daemon(loopback_config(repo, "cpu"));
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    EXPECT_EQ(model_entry(active, "rtdetr_tiny").at("cuda_graphs"), "off: the model runs on cpu");
    EXPECT_EQ(model_entry(active, "rtdetr_tiny").at("device"), "cpu");
    EXPECT_EQ(active.at("torch").at("tf32"), "default");
    EXPECT_EQ(active.at("torch").at("cudnn_benchmark"), true);
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
