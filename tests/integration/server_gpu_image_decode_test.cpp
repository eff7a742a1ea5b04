// The daemon with server.gpu_image_decode on (the `image_decode` slot's nvjpeg, issue 32): the
// random-weight RT-DETR on CUDA answers the fixture JPEGs (two in one request: the
// `image_decode_batch` slot) with transformers' detections within the CPU path's tolerance plus
// the decoders' difference; /active shows the model's bindings with nvjpeg's calls and its
// declines per reason (a progressive JPEG, a truncated one), and the `image_preprocess` slot's
// `cuda` kernel preprocessing each image nvjpeg decoded; the
// truncated JPEG gets the CPU path's exact INVALID_ARGUMENT text. Skips without a GPU; the
// nvjpeg assertions are skipped (with the provider's reason printed) where libnvjpeg is absent.
#include <gtest/gtest.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using nlohmann::json;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

std::string images_request(int64_t n) {
  return "model_name: \"rtdetr_tiny\" inputs { name: \"images\" datatype: \"BYTES\" shape: " +
         std::to_string(n) + " } parameters { key: \"threshold\" value { double_param: 0.3 } }";
}

TEST(ServerGpuImageDecode, FixtureJpegsDecodedOnTheDeviceAndDeclinesCounted) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto repo = temp_dir("gpu_decode_repo");
  add_rtdetr_tiny(repo, "device: cuda\nmax_batch_size: 4\n");
  {
    auto config = loopback_config(repo, "cuda");
    config.tf32.value = "off";
    config.gpu_image_decode.value = "on";
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto expected =
        models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
    const std::vector<std::string> jpegs = {read_file(kFixtures + "/images/astronaut.jpg"),
                                            read_file(kFixtures + "/images/coffee.jpg")};
    const auto r = c.infer(images_request(2), {rpc::pack_bytes(jpegs)});
    ASSERT_TRUE(r.ok()) << r.message;
    const auto counts = values<int32_t>(r.output("num_detections").data);
    const int64_t k = r.output("scores").shape.at(1);
    const auto scores = values<float>(r.output("scores").data);
    const auto boxes = values<float>(r.output("boxes").data);
    double max_score = 0, max_box = 0;
    for (int i = 0; i < 2; ++i) {
      const std::string p = "th0.3_img" + std::to_string(i) + "_";
      auto es = expected->get(p + "scores", at::kFloat, at::kCPU);
      auto eb = expected->get(p + "boxes", at::kFloat, at::kCPU);
      ASSERT_EQ(counts.at(i), es.size(0)) << "image " << i;
      for (int64_t j = 0; j < counts[i]; ++j) {
        max_score = std::max(max_score, std::abs(double(scores[i * k + j]) - es[j].item<float>()));
        for (int q = 0; q < 4; ++q)
          max_box = std::max(max_box,
                             std::abs(double(boxes[(i * k + j) * 4 + q]) - eb[j][q].item<float>()));
      }
    }
    std::cout << "[gpu decode] max |score - expected| = " << max_score
              << ", max |box - expected| = " << max_box << " px" << std::endl;
    // The CPU path's tolerances (server_grpc_test DetectionsMatchTheFixture: 2e-2, 2 px) plus
    // the decoders' few levels.
    EXPECT_LE(max_score, 3e-2);
    EXPECT_LE(max_box, 3.0);

    // Declined images take the CPU path: a progressive one is served, a truncated one gets the
    // CPU path's exact error.
    const std::string set = kFixtures + "/images/jpeg_set/";
    const auto progressive = c.infer(
        images_request(1), {rpc::pack_bytes({read_file(set + "progressive_q90_420_161x97.jpg")})});
    EXPECT_TRUE(progressive.ok()) << progressive.message;
    const auto truncated = c.infer(
        images_request(1), {rpc::pack_bytes({read_file(set + "truncated_q90_420_161x97.jpg")})});
    EXPECT_EQ(truncated.code, api::Code::invalid_argument);
    EXPECT_EQ(truncated.message,
              "input 'images': image 0: truncated JPEG: Premature end of JPEG file");

    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    EXPECT_EQ(active.at("server").at("gpu_image_decode").at("value"), "on");
    // rtdetr_tiny computes in float32 (the CUDA default), where auto would keep the CPU decoder.
    EXPECT_EQ(active.at("models").at(0).at("gpu_image_decode").at("value"), true);
    EXPECT_EQ(active.at("models").at(0).at("gpu_image_decode").at("source"),
              "server.gpu_image_decode");
    std::string provider;
    for (const auto& p : active.at("providers"))
      if (p.at("name") == "nvjpeg")
        provider = p.at("state").get<std::string>() + " " + p.at("detail").get<std::string>();
    const auto& binding = active.at("bindings").at("rtdetr_tiny").at("image_decode");
    std::cout << "[gpu decode] nvjpeg provider: " << provider << "; binding: " << binding.dump()
              << std::endl;
    if (provider.rfind("loaded", 0) != 0) GTEST_SKIP() << "nvjpeg provider: " << provider;
    EXPECT_EQ(binding.at("selected"), "nvjpeg");
    json nv;
    for (const auto& cand : binding.at("candidates"))
      if (cand.at("name") == "nvjpeg") nv = cand;
    ASSERT_FALSE(nv.is_null());
    EXPECT_FALSE(nv.at("disabled").get<bool>());
    const json& declined = nv.at("declined");
    EXPECT_GE(declined.value("nvjpeg: progressive JPEG", 0), 1) << declined.dump();
    EXPECT_EQ(declined.value("nvjpeg: truncated JPEG (no EOI marker)", 0), 1) << declined.dump();
    // Every request's images went through image_decode_batch (the model's DecodeBatcher): the
    // two baseline photographs in one call, then each single-image request in a call of its own
    // (they came one after another). What it left (progressive, truncated) reached image_decode,
    // each decoded by nvjpeg or declined there.
    const auto& batch = active.at("bindings").at("rtdetr_tiny").at("image_decode_batch");
    std::cout << "[gpu decode] batch binding: " << batch.dump() << std::endl;
    EXPECT_EQ(batch.at("selected"), "nvjpeg");
    json nv_batch;
    for (const auto& cand : batch.at("candidates"))
      if (cand.at("name") == "nvjpeg") nv_batch = cand;
    ASSERT_FALSE(nv_batch.is_null());
    EXPECT_EQ(nv_batch.at("calls").get<uint64_t>(), 3u) << batch.dump();
    EXPECT_FALSE(nv_batch.at("disabled").get<bool>());
    uint64_t declines = 0;
    for (const auto& [why, n] : declined.items()) declines += n.get<uint64_t>();
    EXPECT_EQ(nv.at("calls").get<uint64_t>() + declines, 2u) << declined.dump();
    // Each image nvjpeg decoded (the two photographs of the batch, and any single image its
    // image_decode took) was resized and rescaled into its pixel_values by the
    // `image_preprocess` kernel, one call each; the progressive JPEG, decoded on the CPU, took
    // the processor's ATen ops without reaching it.
    const auto& pre = active.at("bindings").at("rtdetr_tiny").at("image_preprocess");
    std::cout << "[gpu decode] image_preprocess binding: " << pre.dump() << std::endl;
    EXPECT_EQ(pre.at("selected"), "cuda");
    json cu;
    for (const auto& cand : pre.at("candidates"))
      if (cand.at("name") == "cuda") cu = cand;
    ASSERT_FALSE(cu.is_null());
    EXPECT_EQ(cu.at("calls").get<uint64_t>(), 2 + nv.at("calls").get<uint64_t>()) << pre.dump();
    EXPECT_TRUE(cu.at("declined").empty()) << pre.dump();
    for (const auto& ev : active.at("fallback_events")) {
      EXPECT_EQ(ev.at("slot").get<std::string>().rfind("image_decode", 0), std::string::npos)
          << ev.dump();
      EXPECT_NE(ev.at("slot").get<std::string>(), "image_preprocess") << ev.dump();
    }
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

// The default (server.gpu_image_decode auto): a bfloat16 CUDA model decodes JPEGs on its GPU, a
// float32 one keeps the CPU decoder (byte-exact preprocessing), and /active says which and why.
TEST(ServerGpuImageDecode, AutoDecodesOnTheGpuForSixteenBitModelsOnly) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto repo = temp_dir("gpu_decode_auto_repo");
  add_rtdetr_tiny(repo, "device: cuda\ndtype: bfloat16\nmax_batch_size: 4\n");
  fs::create_directories(repo / "rtdetr_tiny_fp32");
  fs::copy(repo / "rtdetr_tiny" / "1", repo / "rtdetr_tiny_fp32" / "1",
           fs::copy_options::recursive);
  write_file(repo / "rtdetr_tiny_fp32" / "serving.yaml", "device: cuda\nmax_batch_size: 4\n");
  {
    auto config = loopback_config(repo, "cuda");  // dtype float32 unless serving.yaml says
    config.tf32.value = "off";
    ASSERT_EQ(config.gpu_image_decode.value, "auto");
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()), 64 << 20);
    const auto r = c.infer(images_request(1),
                           {rpc::pack_bytes({read_file(kFixtures + "/images/astronaut.jpg")})});
    ASSERT_TRUE(r.ok()) << r.message;
    const auto active = json::parse(http_get(daemon.http_port(), "/active").body);
    EXPECT_EQ(active.at("server").at("gpu_image_decode").at("value"), "auto");
    json bf16, fp32;
    for (const auto& m : active.at("models")) {
      if (m.at("name") == "rtdetr_tiny") bf16 = m;
      if (m.at("name") == "rtdetr_tiny_fp32") fp32 = m;
    }
    ASSERT_FALSE(bf16.is_null());
    ASSERT_FALSE(fp32.is_null());
    EXPECT_EQ(bf16.at("gpu_image_decode").at("value"), true);
    EXPECT_EQ(bf16.at("gpu_image_decode").at("source"), "default for cuda bfloat16");
    EXPECT_EQ(fp32.at("gpu_image_decode").at("value"), false);
    EXPECT_EQ(fp32.at("gpu_image_decode").at("source"),
              "default for cuda float32: the CPU decoder keeps preprocessing exact");
    const auto& bindings = active.at("bindings");
    EXPECT_TRUE(bindings.at("rtdetr_tiny").contains("image_decode")) << bindings.dump();
    EXPECT_FALSE(bindings.at("rtdetr_tiny_fp32").contains("image_decode")) << bindings.dump();
    daemon.stop(1.0);
  }
  remove_tree(repo);
}

}  // namespace
}  // namespace libreyolo::server
