// CUDA shared memory end to end (Triton's cudaSharedMemory extension): another process (this
// test binary re-executed as a helper) cudaMallocs the fixture's pixel_values, exports a
// cudaIpcMemHandle_t and keeps the allocation alive; the daemon, serving rtdetr_tiny on CUDA,
// registers the handle (CudaSharedMemoryRegister), takes pixel_values from the region as a
// device tensor (no host copy: api::InputTensor::device_data, server/tasks/image_inputs.cpp); the
// detections equal the transformers fixture. (Outputs written into a CUDA region are checked by
// tests/gpu/cuda_shm_client.py, where the client reads its own memory.) Skips without a
// CUDA device, and compiles without CUDA (then it skips too).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "models/core/safetensors.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/shm/registry.h"
#include "server_test_support.h"

#ifdef LIBREYOLO_TEST_CUDART
#include <cuda_runtime_api.h>
#endif

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;
constexpr std::size_t kScoresOffset = 2 * 3 * 640 * 640 * 4;  // after the pixels
constexpr std::size_t kRegionBytes = kScoresOffset + 4096;

/// RFC 4648 base64 (the encoding of raw_handle.b64 over REST).
std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : bytes) {
    acc = (acc << 8) | static_cast<std::uint8_t>(c);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += abc[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += abc[(acc << (6 - bits)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

at::Tensor fixture_pixels() {
  const auto expected =
      models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
  return (expected->get("pixel_u8", at::kFloat, at::kCPU) * 0.00392156862745098f).contiguous();
}

/// The helper process (run only when LIBREYOLO_CUDA_SHM_HELPER is set, by the test below):
/// allocates the region, fills it with the fixture's pixels, writes its 64-byte IPC handle to
/// file descriptor 3 (stdout carries GoogleTest's own output) and keeps the allocation until
/// stdin closes (the test ends), then frees it.
TEST(ServerCudaShmHelper, Allocate) {
  if (!std::getenv("LIBREYOLO_CUDA_SHM_HELPER")) GTEST_SKIP() << "run by ServerCudaShm only";
#ifdef LIBREYOLO_TEST_CUDART
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, kRegionBytes), cudaSuccess);
  const auto pv = fixture_pixels();
  ASSERT_EQ(cudaMemcpy(ptr, pv.data_ptr<float>(), kScoresOffset, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(static_cast<char*>(ptr) + kScoresOffset, 0, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, ptr), cudaSuccess);
  ASSERT_EQ(::write(3, &handle, sizeof(handle)), static_cast<ssize_t>(sizeof(handle)));
  ::close(3);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  cudaFree(ptr);
#endif
}

TEST(ServerCudaShm, PixelValuesFromCudaSharedMemoryMatchTheFixture) {
#ifndef LIBREYOLO_TEST_CUDART
  GTEST_SKIP() << "built without the CUDA runtime";
#else
  if (!at::hasCUDA() || !shm::Registry::cuda_built()) GTEST_SKIP() << "no CUDA device";
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  std::cout.flush();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 3);
    ::close(to_child[1]);
    ::close(from_child[0]);
    ::setenv("LIBREYOLO_CUDA_SHM_HELPER", "1", 1);
    char filter[] = "--gtest_filter=ServerCudaShmHelper.Allocate";
    char* argv[] = {const_cast<char*>("/proc/self/exe"), filter, nullptr};
    ::execv("/proc/self/exe", argv);
    std::_Exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  std::string handle(64, '\0');
  std::size_t got = 0;
  while (got < handle.size()) {
    const ssize_t n = ::read(from_child[0], handle.data() + got, handle.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ASSERT_EQ(got, 64u) << "the helper did not send its handle";

  const auto repo = temp_dir("cuda_shm_repo");
  add_rtdetr_tiny(repo, "device: cuda\nmax_batch_size: 4\n");
  {
    auto config = loopback_config(repo, "cuda");
    config.tf32.value = "off";
    Daemon daemon(config);
    daemon.start();
    ASSERT_TRUE(daemon.core().ready());
    rpc::Client c("127.0.0.1:" + std::to_string(daemon.grpc_port()));
    auto r = c.call("CudaSharedMemoryRegister",
                    "name: \"g\" raw_handle: \"" + rpc::text_escape(handle) +
                        "\" device_id: 0 byte_size: " + std::to_string(kRegionBytes));
    ASSERT_TRUE(r.ok()) << api::code_name(r.code) << ": " << r.message;
    r = c.call("CudaSharedMemoryStatus", "");
    EXPECT_EQ(r.text, "regions {\n  key: \"g\"\n  value {\n    name: \"g\"\n    byte_size: " +
                          std::to_string(kRegionBytes) + "\n  }\n}\n");

    const std::vector<int64_t> sizes = {512, 512, 400, 600};
    const std::string raw_sizes(reinterpret_cast<const char*>(sizes.data()), sizes.size() * 8);
    const auto res = c.infer(
        "model_name: \"rtdetr_tiny\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: "
        "[2, 3, 640, 640] parameters { key: \"shared_memory_region\" value { string_param: \"g\" "
        "} } parameters { key: \"shared_memory_byte_size\" value { int64_param: " +
            std::to_string(kScoresOffset) +
            " } } } inputs { name: \"target_sizes\" datatype: \"INT64\" shape: [2, 2] } "
            "outputs { name: \"num_detections\" } outputs { name: \"scores\" } "
            "parameters { key: \"threshold\" value { double_param: 0.3 } }",
        {raw_sizes});
    ASSERT_TRUE(res.ok()) << res.message;
    const auto expected =
        models::core::SafetensorsFile::open(kFixtures + "/models/rtdetr_tiny/expected.safetensors");
    const auto counts = values<int32_t>(res.output("num_detections").data);
    const auto scores = values<float>(res.output("scores").data);
    const int64_t k = res.output("scores").shape.at(1);
    double ds = 0;
    for (int i = 0; i < 2; ++i) {
      auto es = expected->get("th0.3_img" + std::to_string(i) + "_scores", at::kFloat, at::kCPU);
      EXPECT_EQ(counts.at(i), es.size(0)) << "image " << i;
      for (int64_t j = 0; j < std::min<int64_t>(counts.at(i), es.size(0)); ++j)
        ds = std::max(ds, std::abs(double(scores[i * k + j]) - es[j].item<float>()));
    }
    std::cout << "[gpu] CUDA shared memory pixel_values: max |score - expected| = " << ds << "\n";
    EXPECT_LE(ds, 1e-4);
    EXPECT_TRUE(c.call("CudaSharedMemoryUnregister", "name: \"g\"").ok());
    EXPECT_EQ(c.call("CudaSharedMemoryStatus", "").text, "");

    // The same region over REST (one registry: the gRPC status sees it), pixel_values from it.
    using nlohmann::json;
    const int hp = daemon.http_port();
    const json reg = {
        {"raw_handle", {{"b64", base64(handle)}}}, {"device_id", 0}, {"byte_size", kRegionBytes}};
    auto h = http_request(hp, "POST", "/v2/cudasharedmemory/region/h/register", reg.dump());
    ASSERT_EQ(h.status, 200) << h.body;
    h = http_request(hp, "GET", "/v2/cudasharedmemory/status");
    EXPECT_EQ(h.body, "[{\"byte_size\":" + std::to_string(kRegionBytes) +
                          ",\"device_id\":0,\"name\":\"h\"}]");
    EXPECT_EQ(c.call("CudaSharedMemoryStatus", "").text,
              "regions {\n  key: \"h\"\n  value {\n    name: \"h\"\n    byte_size: " +
                  std::to_string(kRegionBytes) + "\n  }\n}\n");
    const json body = {
        {"parameters", {{"threshold", 0.3}}},
        {"inputs",
         {{{"name", "pixel_values"},
           {"datatype", "FP32"},
           {"shape", {2, 3, 640, 640}},
           {"parameters",
            {{"shared_memory_region", "h"}, {"shared_memory_byte_size", kScoresOffset}}}},
          {{"name", "target_sizes"},
           {"datatype", "INT64"},
           {"shape", {2, 2}},
           {"data", {512, 512, 400, 600}}}}},
        {"outputs", {{{"name", "num_detections"}}}}};
    h = http_request(hp, "POST", "/v2/models/rtdetr_tiny/infer", body.dump());
    ASSERT_EQ(h.status, 200) << h.body;
    const json hj = json::parse(h.body);
    EXPECT_EQ(hj["outputs"][0]["data"], json(std::vector<int32_t>(counts.begin(), counts.end())))
        << h.body;
    h = http_request(hp, "POST", "/v2/cudasharedmemory/region/h/unregister");
    EXPECT_EQ(h.status, 200) << h.body;
    EXPECT_EQ(http_request(hp, "GET", "/v2/cudasharedmemory/status").body, "[]");
    // After the unregister (a second open of one handle in one process may share its mapping):
    // more bytes than the allocation holds is refused.
    r = c.call("CudaSharedMemoryRegister", "name: \"big\" raw_handle: \"" +
                                               rpc::text_escape(handle) +
                                               "\" device_id: 0 byte_size: 1000000000000");
    EXPECT_EQ(r.code, Code::invalid_argument) << r.message;
    EXPECT_EQ(r.message.rfind("failed to register shared memory region", 0), 0u) << r.message;
    daemon.stop(1.0);
  }
  ::close(to_child[1]);  // the helper frees its allocation and exits
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::close(from_child[0]);
  remove_tree(repo);
#endif
}

}  // namespace
}  // namespace libreyolo::server
