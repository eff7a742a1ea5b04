// instance_group (Triton's ModelInstanceGroup) on the CPU: several KIND_CPU instances of one
// model, each loaded with its own options (instance name), fed by one dynamic batcher; the
// statistics aggregate over them; an instance whose device fails is taken out of rotation
// while the others serve; a GPU that does not exist is a load error naming it.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "kernels/registry.h"
#include "models/runtime/device_memory.h"
#include "models/runtime/intra_op_threads.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/config/serving_config.h"
#include "server/grpc/client.h"
#include "server/metrics/metrics.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

const std::string kPixels = std::string(3 * 8 * 8 * 4, '\0');

std::string pv_request(const std::string& model) {
  return "model_name: \"" + model +
         "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, 8] }";
}

ModelFactory fake_factory() {
  return [](const std::string&, const models::LoadOptions& o) -> std::unique_ptr<models::Model> {
    return std::make_unique<FakeDetector>(o);
  };
}

class InstanceGroups : public ::testing::Test {
 protected:
  /// `intra_op_threads`: server.intra_op_threads (0: the CPU budget's cores).
  void start(const std::string& serving_yaml, int intra_op_threads = 0) {
    FakeState::get().reset();
    repo_ = temp_dir("instances");
    add_fake_model(repo_, "fake", serving_yaml);
    auto config = loopback_config(repo_);
    config.intra_op_threads.value = intra_op_threads;
    daemon_ = std::make_unique<Daemon>(config, fake_factory());
    daemon_->start();
    FakeState::get().reset();  // forget the warm-ups
    client_ = std::make_unique<rpc::Client>("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  void TearDown() override {
    client_.reset();
    if (daemon_) daemon_->stop(1.0);
    daemon_.reset();
    FakeState::get().reset();
    remove_tree(repo_);
  }
  /// `n` requests at once (each one image); returns the codes.
  std::vector<Code> burst(int n) {
    std::vector<std::future<rpc::InferResult>> calls;
    for (int i = 0; i < n; ++i)
      calls.push_back(std::async(std::launch::async, [this] {
        rpc::Client c("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
        return c.infer(pv_request("fake"), {kPixels});
      }));
    std::vector<Code> codes;
    for (auto& f : calls) codes.push_back(f.get().code);
    return codes;
  }
  nlohmann::json active() {
    return nlohmann::json::parse(http_get(daemon_->http_port(), "/active").body);
  }
  /// Polls /active until `done` holds (true) or 60 s pass (false): for a state change that
  /// follows an answer the test already has (an instance leaving the rotation).
  bool wait_active(const std::function<bool(const nlohmann::json&)>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < end) {
      if (done(active())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  fs::path repo_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<rpc::Client> client_;
};

/// Records at::get_num_threads() in every forward (FakeState::in_forward, on the instances'
/// threads) while it lives.
struct ForwardThreads {
  std::mutex mu;
  std::vector<int> seen;
  void install() {
    auto& st = FakeState::get();
    std::lock_guard<std::mutex> lk(st.mu);
    st.in_forward = [this] {
      std::lock_guard<std::mutex> held(mu);
      seen.push_back(at::get_num_threads());
    };
  }
  ~ForwardThreads() {
    auto& st = FakeState::get();
    std::lock_guard<std::mutex> lk(st.mu);
    st.in_forward = nullptr;
  }
};

TEST_F(InstanceGroups, ThreeCpuInstancesShareTheQueue) {
  // server.intra_op_threads 6: each of the three CPU instances forwards with 2.
  start("max_batch_size: 1\ninstance_group: [{count: 3, kind: KIND_CPU}]\n", 6);
  FakeState::get().sleep_ms = 50;  // long enough that a burst keeps every instance busy
  ForwardThreads threads;
  threads.install();
  const auto codes = burst(12);
  for (auto c : codes) EXPECT_EQ(c, Code::ok);
  const auto instances = FakeState::get().instances;
  EXPECT_EQ(instances.size(), 12u);
  std::map<std::string, int> per;
  for (const auto& i : instances) per[i] += 1;
  // Every instance ran batches: three workers took from one queue.
  EXPECT_EQ(per.size(), 3u) << "instances used: " << per.size();
  for (const char* name : {"fake_0", "fake_1", "fake_2"}) EXPECT_GT(per[name], 0) << name;
  const int share = 2;
  const auto a = active();
  const auto& model = a["models"][0];
  ASSERT_EQ(model["instances"].size(), 3u) << model.dump();
  std::uint64_t batches = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& st = model["instances"][i];
    EXPECT_EQ(st["name"], "fake_" + std::to_string(i));
    EXPECT_EQ(st["device"], "cpu");
    EXPECT_EQ(st["healthy"], true);
    EXPECT_EQ(st["batches"].get<int>(), per["fake_" + std::to_string(i)]);
    // The three CPU instances share the process's intra-op threads (at least one each).
    EXPECT_EQ(st["intra_op_threads"], share) << st.dump();
    batches += st["batches"].get<std::uint64_t>();
  }
  EXPECT_EQ(batches, 12u);
  EXPECT_EQ(threads.seen, std::vector<int>(12, share));
  // ModelStatistics aggregates over the instances (Triton).
  const auto stats = client_->call("ModelStatistics", "name: \"fake\"").text;
  EXPECT_NE(stats.find("inference_count: 12\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("execution_count: 12\n"), std::string::npos) << stats;
  // ModelConfig reports the group (Triton's ModelInstanceGroup).
  const auto config = client_->call("ModelConfig", "name: \"fake\"").text;
  EXPECT_NE(config.find("  instance_group {\n    name: \"fake_0\"\n    count: 3\n    kind: "
                        "KIND_CPU\n  }\n"),
            std::string::npos)
      << config;
  const auto metrics = http_get(daemon_->http_port(), "/metrics").body;
  double queue_seconds = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string labels =
        "{device=\"cpu\",instance=\"fake_" + std::to_string(i) + "\",model=\"fake\"}";
    const std::string n = std::to_string(per["fake_" + std::to_string(i)]);
    EXPECT_NE(metrics.find("libreyolo_instance_ready" + labels + " 1"), std::string::npos)
        << labels;
    EXPECT_NE(metrics.find("libreyolo_instance_batches_total" + labels + " " + n + "\n"),
              std::string::npos)
        << labels;
    // max_batch_size 1: one request per batch.
    EXPECT_NE(metrics.find("libreyolo_instance_requests_total" + labels + " " + n + "\n"),
              std::string::npos)
        << labels;
    const std::string q = "libreyolo_instance_queue_seconds_total" + labels + " ";
    const auto at = metrics.find(q);
    ASSERT_NE(at, std::string::npos) << labels;
    queue_seconds += std::stod(metrics.substr(at + q.size()));
  }
  // The instances' queue seconds add up to the model's queue duration (ModelStatistics, ns):
  // both are each request's enqueue -> batch start.
  const auto q = stats.find("queue {\n");
  ASSERT_NE(q, std::string::npos) << stats;
  const auto ns = stats.find("ns: ", q);
  ASSERT_NE(ns, std::string::npos) << stats;
  EXPECT_NEAR(queue_seconds, std::stod(stats.substr(ns + 4)) * 1e-9, 1e-6) << stats;
  // CPU instances only: no GPU memory series, an empty gpu_memory in /active, no device time.
  EXPECT_EQ(metrics.find("libreyolo_gpu_memory_total_bytes{"), std::string::npos);
  EXPECT_EQ(metrics.find("libreyolo_instance_device_seconds_total{"), std::string::npos);
  EXPECT_EQ(a["gpu_memory"], nlohmann::json::array());
}

TEST_F(InstanceGroups, OneCpuInstanceTakesEveryIntraOpThreadTheRequestThreadsNone) {
  start("max_batch_size: 1\n", 6);
  ForwardThreads threads;
  threads.install();
  std::mutex mu;
  std::vector<int> request_threads;  // at::get_num_threads() on the threads running the calls
  daemon_->core().lookup_hook_for_testing = [&](const std::string&) {
    std::lock_guard<std::mutex> lk(mu);
    request_threads.push_back(at::get_num_threads());
  };
  const auto codes = burst(4);
  daemon_->core().lookup_hook_for_testing = nullptr;
  for (auto c : codes) EXPECT_EQ(c, Code::ok);
  // The forward's team is the process's (server.intra_op_threads); the gRPC executor threads
  // that parse the requests and render their answers fork none (ServerCore::infer).
  EXPECT_EQ(threads.seen, std::vector<int>(4, 6));
  EXPECT_EQ(request_threads, std::vector<int>(4, 1));
  const auto st = active()["models"][0]["instances"][0];
  EXPECT_EQ(st["intra_op_threads"], 6) << st.dump();
  // /active's process figure does not depend on the thread asking: one that runs on itself alone
  // (as a request's thread does after its first call) still reports the process's 6.
  nlohmann::json cpu;
  std::thread([&] {
    models::use_intra_op_threads(1);
    cpu = nlohmann::json::parse(daemon_->core().active_json())["cpu"];
  }).join();
  EXPECT_EQ(cpu["intra_op_threads"], 6) << cpu.dump();
  EXPECT_EQ(cpu["intra_op_threads_source"], "server.intra_op_threads") << cpu.dump();
}

// The GPU memory families as the daemon renders what models::device_memory read (the CUDA
// test reads a real device: tests/integration/server_cuda_test.cpp).
TEST(InstanceMetrics, GpuMemoryPerDevice) {
  Metrics metrics;
  models::DeviceMemory g;
  g.device = "cuda:1";
  g.total_bytes = 150000000000;
  g.used_bytes = 2000000000;
  g.allocated_bytes = 1500000000;
  g.reserved_bytes = 1800000000;
  const auto text = metrics.serialize({g});
  EXPECT_NE(text.find("# TYPE libreyolo_gpu_memory_total_bytes gauge\n"
                      "libreyolo_gpu_memory_total_bytes{device=\"cuda:1\"} 150000000000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("libreyolo_gpu_memory_used_bytes{device=\"cuda:1\"} 2000000000\n"),
            std::string::npos);
  EXPECT_NE(text.find("libreyolo_gpu_memory_allocated_bytes{device=\"cuda:1\"} 1500000000\n"),
            std::string::npos);
  EXPECT_NE(text.find("libreyolo_gpu_memory_reserved_bytes{device=\"cuda:1\"} 1800000000\n"),
            std::string::npos);
  EXPECT_EQ(metrics.serialize().find("libreyolo_gpu_memory_total_bytes{"), std::string::npos);
}

// The device time of an instance's batches (CUDA events): summed per instance, and no series
// for a batch without one (a CPU instance's -1).
TEST(InstanceMetrics, DeviceSecondsSummedPerInstance) {
  Metrics metrics;
  metrics.instance_batch("m", "m_0", "cuda:0", 32, 0.5, 0.25);
  metrics.instance_batch("m", "m_0", "cuda:0", 24, 0.5, 0.5);
  metrics.instance_batch("m", "m_1", "cpu", 4, 1.5);
  metrics.instance_batch("m", "m_2", "cuda:0", 8, 0.25, 0.125);  // a second instance on the GPU
  const auto text = metrics.serialize();
  // (prometheus-cpp keeps a family's series in an unordered_map: each line found on its own)
  EXPECT_NE(text.find("# TYPE libreyolo_instance_device_seconds_total counter\n"),
            std::string::npos);
  EXPECT_NE(
      text.find("\nlibreyolo_instance_device_seconds_total{device=\"cuda:0\",instance=\"m_0\","
                "model=\"m\"} 0.75\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("\nlibreyolo_instance_device_seconds_total{device=\"cuda:0\",instance=\"m_2\","
                "model=\"m\"} 0.125\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("libreyolo_instance_device_seconds_total{device=\"cpu\""), std::string::npos);
  EXPECT_NE(text.find("libreyolo_instance_images_total{device=\"cuda:0\",instance=\"m_0\","
                      "model=\"m\"} 56\n"),
            std::string::npos);
}

// Only named CUDA devices are read; "cpu", repeats and indices that do not exist are left out.
TEST(InstanceMetrics, DeviceMemoryReadsOnlyNamedCudaDevices) {
  EXPECT_TRUE(models::device_memory({"cpu", "cuda:4096", "cuda:x"}).empty());
  const auto gpus = models::device_memory({"cpu", "cuda:0", "cuda:0"});
  if (!at::hasCUDA()) {
    EXPECT_TRUE(gpus.empty());
    return;
  }
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].device, "cuda:0");
  EXPECT_GT(gpus[0].total_bytes, 0u);
  EXPECT_GE(gpus[0].total_bytes, gpus[0].used_bytes);
  EXPECT_GE(gpus[0].reserved_bytes, gpus[0].allocated_bytes);
}

TEST_F(InstanceGroups, AFailedDeviceLeavesTheRotationTheOthersServe) {
  start("max_batch_size: 1\ninstance_group: [{count: 2, kind: KIND_CPU}]\n");
  {
    std::lock_guard<std::mutex> lk(FakeState::get().mu);
    FakeState::get().fail_instance = "fake_1";
  }
  const std::string failure =
      "model 'fake': instance fake_1 on cpu failed: CUDA out of memory (simulated)";
  {
    // Request A goes to either instance. fake_1 fails it; fake_0 holds it in its forward, and
    // then B can only go to fake_1, which fails it. Either way exactly one answer is the
    // failure, decided by events, not by timing.
    HeldForwards held;
    auto a = std::async(std::launch::async, [this] {
      rpc::Client c("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
      return c.infer(pv_request("fake"), {kPixels});
    });
    ASSERT_TRUE(FakeState::get().wait_entered(1));
    bool a_on_fake_0;
    {
      std::lock_guard<std::mutex> lk(FakeState::get().mu);
      a_on_fake_0 = FakeState::get().instances == std::vector<std::string>{"fake_0"};
    }
    if (a_on_fake_0) {
      const auto b = client_->infer(pv_request("fake"), {kPixels});
      EXPECT_EQ(b.code, Code::internal);
      EXPECT_EQ(b.message, failure);
      held.release();
      EXPECT_TRUE(a.get().ok());
    } else {
      const auto r = a.get();
      EXPECT_EQ(r.code, Code::internal);
      EXPECT_EQ(r.message, failure);
    }
  }
  // The instance left the rotation before its failed batch was answered (take_out), so
  // /active already says so and every retry reaches fake_0.
  EXPECT_EQ(active()["models"][0]["instances"][1]["healthy"], false);
  for (auto c : burst(8)) EXPECT_EQ(c, Code::ok);  // fake_0 alone serves them
  auto r = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_TRUE(r.ok()) << r.message;
  const auto a = active();
  const auto& inst = a["models"][0]["instances"];
  EXPECT_EQ(inst[0]["healthy"], true);
  EXPECT_EQ(inst[1]["healthy"], false);
  EXPECT_EQ(inst[1]["error"], "CUDA out of memory (simulated)");
  EXPECT_EQ(a["models"][0]["state"], "READY");  // one instance still serves
  EXPECT_EQ(client_->call("ModelReady", "name: \"fake\"").text, "ready: true\n");
  const auto metrics = http_get(daemon_->http_port(), "/metrics").body;
  EXPECT_NE(metrics.find("libreyolo_instance_ready{device=\"cpu\",instance=\"fake_1\",model="
                         "\"fake\"} 0"),
            std::string::npos);
  EXPECT_NE(metrics.find("libreyolo_instance_failures_total{device=\"cpu\",instance=\"fake_1\","
                         "model=\"fake\"} 1"),
            std::string::npos);

  // The last instance fails too: the model is UNAVAILABLE with the reason, not hanging.
  {
    std::lock_guard<std::mutex> lk(FakeState::get().mu);
    FakeState::get().fail_instance = "*";
  }
  r = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_EQ(r.code, Code::internal);
  EXPECT_EQ(r.message,
            "model 'fake': instance fake_0 on cpu failed: CUDA out of memory (simulated)");
  EXPECT_TRUE(wait_active(
      [](const nlohmann::json& a) { return a["models"][0]["state"] == "UNAVAILABLE"; }));
  r = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_EQ(r.code, Code::unavailable);
  EXPECT_EQ(r.message,
            "model 'fake' is not ready (UNAVAILABLE: every instance failed; last: CUDA out of "
            "memory (simulated))");
  EXPECT_EQ(client_->call("ServerReady").text, "");
}

/// A kernel slot's first out-of-memory in a row inside the forward (kernels/out_of_memory.h) fails
/// only its request, RESOURCE_EXHAUSTED (retryable): the implementation stays enabled, the instance
/// stays in rotation, and the retry is served by the same implementation.
TEST_F(InstanceGroups, AKernelsTransientOutOfMemoryIsRetryable) {
  constexpr kernels::SlotDef<int(int)> kSlot{"oom_slot"};
  kernels::Registry registry;
  registry.declare(kSlot);
  registry.register_impl(kSlot, kernels::kReference,
                         std::function<kernels::Outcome<int>(int)>([](int x) { return x; }));
  std::atomic<int> cuda_calls{0};
  registry.register_impl(
      kSlot, "cuda", std::function<kernels::Outcome<int>(int)>([&cuda_calls](int x) -> int {
        if (cuda_calls++ == 0)
          TORCH_CHECK_WITH(OutOfMemoryError, false,
                           "CUDA out of memory. Tried to allocate 1.00 GiB (simulated)");
        return x;
      }));
  const auto handle = registry.bind(kSlot, kernels::BindContext{});
  start("max_batch_size: 1\n");
  {
    std::lock_guard<std::mutex> lk(FakeState::get().mu);
    FakeState::get().in_forward = [handle] { handle(1); };
  }
  auto r = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_EQ(r.code, Code::resource_exhausted);
  EXPECT_EQ(r.message,
            "model 'fake': kernel oom_slot/cuda ran out of memory: CUDA out of memory. Tried to "
            "allocate 1.00 GiB (simulated)");
  r = client_->infer(pv_request("fake"), {kPixels});
  EXPECT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(cuda_calls.load(), 2);
  EXPECT_EQ(registry.active().at("oom_slot"), "cuda");
  EXPECT_EQ(active()["models"][0]["instances"][0]["healthy"], true);
  EXPECT_NE(http_get(daemon_->http_port(), "/metrics")
                .body.find("libreyolo_inference_requests_total{code=\"RESOURCE_EXHAUSTED\","
                           "model=\"fake\",version=\"1\"} 1"),
            std::string::npos);
  std::lock_guard<std::mutex> lk(FakeState::get().mu);
  FakeState::get().in_forward = nullptr;  // it holds `registry`'s handle
}

TEST(InstanceGroupConfig, GpusThatDoNotExistAreALoadErrorNamingThem) {
  if (at::getNumGPUs() > 0) GTEST_SKIP() << "the message differs with a GPU";
  const auto repo = temp_dir("instances-gpu");
  add_fake_model(repo, "fake", "instance_group: [{count: 1, kind: KIND_GPU, gpus: [0, 3]}]\n");
  Daemon d(loopback_config(repo), fake_factory());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  const auto idx = c.call("RepositoryIndex").text;
  EXPECT_NE(idx.find("reason: \"" + (repo / "fake" / "serving.yaml").string() +
                     ":1:18: instance_group: KIND_GPU gpus [0, 3]: no CUDA device is visible\""),
            std::string::npos)
      << idx;
  d.stop(1.0);
  remove_tree(repo);
}

TEST(InstanceGroupConfig, ServingYamlErrorsNameTheKey) {
  struct Case {
    std::string yaml, message;
  };
  const std::vector<Case> cases = {
      {"instance_group: {count: 2}\n",
       "s.yaml:1:17: instance_group must be a list of {count, kind, gpus} entries"},
      {"instance_group: [{count: 0}]\n",
       "s.yaml:1:26: instance_group.count must be between 1 and 64, got 0"},
      {"instance_group: [{kind: KIND_TPU}]\n",
       "s.yaml:1:25: instance_group.kind must be KIND_GPU, KIND_CPU or KIND_AUTO, got 'KIND_TPU'"},
      {"instance_group: [{gpus: [1, 1]}]\n",
       "s.yaml:1:29: instance_group.gpus: GPU 1 is listed twice"},
      {"instance_group: [{kind: KIND_CPU, gpus: [0]}]\n",
       "s.yaml:1:18: instance_group: KIND_CPU takes no gpus"},
      {"instance_group: [{cnt: 2}]\n",
       "s.yaml:1:19: unknown key instance_group.cnt (expected count, kind, gpus)"},
  };
  for (const auto& c : cases) {
    try {
      parse_serving_config(c.yaml, "s.yaml");
      ADD_FAILURE() << "no error for " << c.yaml;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), c.message) << c.yaml;
    }
  }
  const auto ok = parse_serving_config(
      "instance_group: [{count: 2, kind: KIND_GPU, gpus: [0, 1]}, {count: 1, kind: KIND_CPU}]\n",
      "s.yaml");
  ASSERT_EQ(ok.instance_group.size(), 2u);
  EXPECT_EQ(ok.instance_group[0].count, 2);
  EXPECT_EQ(ok.instance_group[0].kind, server::InstanceGroup::Kind::gpu);
  EXPECT_EQ(ok.instance_group[0].gpus, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(ok.instance_group[1].kind, server::InstanceGroup::Kind::cpu);
}

}  // namespace
}  // namespace libreyolo::server
