// Triton's shared-memory extensions over gRPC against the daemon in process (fake detector):
// register / status / unregister of system regions with Triton's codes and messages, inputs
// read from a region and outputs written into one (omitted from raw_output_contents, named by
// the output's parameters), every bounds and parameter error, an unregister while a request
// uses the region (deferred: the request completes and its output still lands in the region),
// CUDA registration without a device, cancellation and deadlines notified (not polled), and a
// prompt stop with idle client channels.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/grpc/grpc_server.h"
#include "server/shm/registry.h"
#include "server/shm/tensor_params.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;
using SteadyClock = std::chrono::steady_clock;

double since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

using ShmObject = PosixShm;  // server_test_support.h

ModelFactory fake_factory() {
  return [](const std::string&, const models::LoadOptions&) -> std::unique_ptr<models::Model> {
    return std::make_unique<FakeDetector>();
  };
}

/// The value of one Prometheus sample line `name` (-1 when absent).
double sample(const std::string& metrics, const std::string& name) {
  const auto at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + name.size() + 2));
}

constexpr std::size_t kPixelBytes = 3 * 8 * 8 * 4;     // one 8x8 image, FP32
const float kScore = 1.0f / (1.0f + std::exp(-2.0f));  // the fake's sigmoid(2)

std::string shm_params(const std::string& region, std::int64_t offset, std::int64_t bytes) {
  return "parameters { key: \"shared_memory_region\" value { string_param: \"" + region +
         "\" } } parameters { key: \"shared_memory_offset\" value { int64_param: " +
         std::to_string(offset) +
         " } } parameters { key: \"shared_memory_byte_size\" value { int64_param: " +
         std::to_string(bytes) + " } }";
}

/// pixel_values [1,3,8,8] from region `region` at `offset`, `bytes` long; `outputs` as text.
std::string shm_request(const std::string& region, std::int64_t offset, std::int64_t bytes,
                        const std::string& outputs = "outputs { name: \"num_detections\" }") {
  return "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, "
         "8, 8] " +
         shm_params(region, offset, bytes) + " } " + outputs;
}

class Shm : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeState::get().reset();
    repo_ = temp_dir("shm");
    add_fake_model(repo_, "fake", "max_batch_size: 4\nmax_queue_delay_microseconds: 0\n");
    auto config = loopback_config(repo_);
    config.http_address.value = "off";
    daemon_ = std::make_unique<Daemon>(config, fake_factory());
    daemon_->start();
    FakeState::get().reset();  // forget the warm-up forward
    client_ = std::make_unique<rpc::Client>("127.0.0.1:" + std::to_string(daemon_->grpc_port()));
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    FakeState::get().reset();
    remove_tree(repo_);
  }
  rpc::CallResult call(const std::string& method, const std::string& text) {
    return client_->call(method, text);
  }
  rpc::CallResult register_system(const std::string& name, const std::string& key,
                                  std::uint64_t offset, std::uint64_t bytes) {
    return call("SystemSharedMemoryRegister", "name: \"" + name + "\" key: \"" + key +
                                                  "\" offset: " + std::to_string(offset) +
                                                  " byte_size: " + std::to_string(bytes));
  }
  std::string metrics() { return daemon_->metrics().serialize(); }
  bool wait_pending(int n) {
    const auto end = SteadyClock::now() + std::chrono::seconds(5);
    while (SteadyClock::now() < end) {
      if (sample(metrics(), "libreyolo_pending_requests{model=\"fake\"}") == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  static bool wait_forwards(std::size_t n) {
    const auto end = SteadyClock::now() + std::chrono::seconds(5);
    while (SteadyClock::now() < end) {
      if (FakeState::get().batches().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  fs::path repo_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<rpc::Client> client_;
};

// ---- register / status / unregister --------------------------------------------------------

TEST_F(Shm, SystemRegisterStatusUnregisterWithTritonsMessages) {
  ShmObject obj("status", 4096);
  auto r = register_system("in", obj.key(), 100, 1000);
  ASSERT_TRUE(r.ok()) << r.message;
  const std::string entry = "regions {\n  key: \"in\"\n  value {\n    name: \"in\"\n    key: \"" +
                            obj.key() + "\"\n    offset: 100\n    byte_size: 1000\n  }\n}\n";
  r = call("SystemSharedMemoryStatus", "");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.text, entry);
  r = call("SystemSharedMemoryStatus", "name: \"in\"");
  EXPECT_EQ(r.text, entry);

  r = register_system("in", obj.key(), 0, 16);
  EXPECT_EQ(r.code, Code::already_exists);
  EXPECT_EQ(r.message, "shared memory region 'in' already in manager");
  r = register_system("missing", "/libreyolo_no_such_key", 0, 16);
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message,
            "Unable to open shared memory region: '/libreyolo_no_such_key': No such file or "
            "directory");
  r = register_system("big", obj.key(), 4000, 200);
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "failed to register shared memory region 'big': invalid args (offset 4000 + "
            "byte_size 200 must be within the 4096 bytes of shared memory key '" +
                obj.key() + "')");
  r = register_system("empty", obj.key(), 0, 0);
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "failed to register shared memory region 'empty': invalid args (offset 0 + "
            "byte_size 0 must be within the 4096 bytes of shared memory key '" +
                obj.key() + "', and byte_size above 0)");
  // 2^64 - 1: offset + byte_size must not wrap around.
  r = register_system("wrap", obj.key(), 18446744073709551615ull, 2);
  EXPECT_EQ(r.code, Code::invalid_argument);

  r = call("SystemSharedMemoryStatus", "name: \"nope\"");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "Unable to find system shared memory region: 'nope'");
  r = call("CudaSharedMemoryStatus", "name: \"in\"");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message,
            "The region named 'in' is registered as system shared memory, not CUDA shared memory");
  r = call("CudaSharedMemoryStatus", "name: \"nope\"");
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "Unable to find cuda shared memory region: 'nope'");
  r = call("CudaSharedMemoryStatus", "");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.text, "");

  // Unknown names and the other kind are no error (Triton); the region stays.
  EXPECT_TRUE(call("SystemSharedMemoryUnregister", "name: \"nope\"").ok());
  EXPECT_TRUE(call("CudaSharedMemoryUnregister", "name: \"in\"").ok());
  EXPECT_EQ(call("SystemSharedMemoryStatus", "").text, entry);
  ASSERT_TRUE(register_system("in2", obj.key(), 0, 4096).ok());
  EXPECT_TRUE(call("SystemSharedMemoryUnregister", "name: \"in\"").ok());
  r = call("SystemSharedMemoryStatus", "");
  EXPECT_EQ(r.text, "regions {\n  key: \"in2\"\n  value {\n    name: \"in2\"\n    key: \"" +
                        obj.key() + "\"\n    byte_size: 4096\n  }\n}\n");  // offset 0: not printed
  EXPECT_TRUE(call("SystemSharedMemoryUnregister", "").ok());              // every system region
  EXPECT_EQ(call("SystemSharedMemoryStatus", "").text, "");
  // A name is free again once unregistered.
  EXPECT_TRUE(register_system("in", obj.key(), 0, 16).ok());
}

TEST_F(Shm, ServerMetadataListsTheExtensions) {
  const auto r = call("ServerMetadata", "");
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_NE(r.text.find("extensions: \"system_shared_memory\"\n"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("extensions: \"cuda_shared_memory\"\n") != std::string::npos,
            shm::Registry::cuda_built())
      << r.text;
}

/// CUDA registration: a handle of the wrong size is INVALID_ARGUMENT; on a machine without a
/// device (or a build without CUDA) a well-formed one is UNAVAILABLE, saying why.
TEST_F(Shm, CudaRegisterWithoutADeviceIsUnavailable) {
  auto r = call("CudaSharedMemoryRegister",
                "name: \"g\" raw_handle: \"abc\" device_id: 0 byte_size: 16");
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "failed to register CUDA shared memory region 'g': raw_handle has 3 bytes, expected "
            "64 (a cudaIpcMemHandle_t)");
  const std::string handle = rpc::text_escape(std::string(64, '\0'));
  r = call("CudaSharedMemoryRegister",
           "name: \"g\" raw_handle: \"" + handle + "\" device_id: 0 byte_size: 16");
  if (!shm::Registry::cuda_built()) {
    EXPECT_EQ(r.code, Code::unavailable);
    EXPECT_EQ(r.message,
              "CUDA shared memory is not available: this libreyolo-server was built without CUDA");
  } else if (r.code == Code::unavailable) {  // a CUDA build on a machine without a device
    EXPECT_EQ(r.message.rfind("CUDA shared memory is not available: no CUDA device (", 0), 0u)
        << r.message;
  } else {  // a device: a handle of zeros opens nothing
    EXPECT_EQ(r.code, Code::invalid_argument) << r.message;
    EXPECT_EQ(r.message.rfind("failed to register shared memory region: invalid args", 0), 0u)
        << r.message;
  }
  EXPECT_EQ(call("CudaSharedMemoryStatus", "").text, "");
}

// ---- inference through shared memory -------------------------------------------------------

/// pixel_values read from a region (at an offset that is not page-aligned, in a region that
/// does not start at a page either); scores and boxes written into another region and left out
/// of raw_output_contents, labels and num_detections returned as usual.
TEST_F(Shm, InputFromARegionOutputsIntoARegion) {
  ShmObject in("in", 8192), out("out", 4096);
  float* pixels = reinterpret_cast<float*>(in.data() + 300 + 12);
  double want_sum = 0;
  for (std::size_t i = 0; i < kPixelBytes / 4; ++i) {
    pixels[i] = 0.25f * static_cast<float>(i % 7);
    want_sum += pixels[i];
  }
  ASSERT_TRUE(register_system("in", in.key(), 300, 4000).ok());
  ASSERT_TRUE(register_system("out", out.key(), 0, 4096).ok());
  const std::string outputs = "outputs { name: \"scores\" " + shm_params("out", 0, 16) +
                              " } outputs { name: \"labels\" } outputs { name: \"boxes\" " +
                              shm_params("out", 64, 64) + " } outputs { name: \"num_detections\" }";
  const auto r = client_->infer(shm_request("in", 12, kPixelBytes, outputs));
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(FakeState::get().sums(), std::vector<double>{want_sum});
  // Outputs in host memory first (their raw_output_contents at their index), then those in
  // shared memory, whose parameters name the region.
  ASSERT_EQ(r.outputs.size(), 4u);
  EXPECT_EQ(r.outputs[0].name, "labels");
  EXPECT_EQ(r.outputs[1].name, "num_detections");
  EXPECT_EQ(r.outputs[2].name, "scores");
  EXPECT_EQ(r.outputs[3].name, "boxes");
  EXPECT_EQ(values<int32_t>(r.output("num_detections").data), std::vector<int32_t>{4});
  EXPECT_EQ(values<int64_t>(r.output("labels").data).size(), 4u);
  EXPECT_EQ(r.output("scores").data, "");
  EXPECT_EQ(r.output("scores").shape, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(r.output("scores").parameters,
            (std::map<std::string, api::Parameter>{{"shared_memory_region", std::string("out")},
                                                   {"shared_memory_byte_size", std::int64_t{16}}}));
  EXPECT_EQ(r.output("boxes").parameters,
            (std::map<std::string, api::Parameter>{{"shared_memory_region", std::string("out")},
                                                   {"shared_memory_byte_size", std::int64_t{64}},
                                                   {"shared_memory_offset", std::int64_t{64}}}));
  const auto* scores = reinterpret_cast<const float*>(out.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(scores[i], kScore, 1e-6f) << i;
  // Query q's box is (0.2q + 0.15, 0.4, 0.2q + 0.25, 0.6) * 8: every y0 is 3.2, every y1 4.8.
  const auto* boxes = reinterpret_cast<const float*>(out.data() + 64);
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(boxes[j * 4 + 1], 3.2f, 1e-4f) << j;
    EXPECT_NEAR(boxes[j * 4 + 3], 4.8f, 1e-4f) << j;
  }
  EXPECT_EQ(out.data()[16], 0) << "wrote past the 16 bytes of scores";
}

/// Every bounds and parameter error of an input, with its code and message; none reaches the
/// model.
TEST_F(Shm, InputErrorsNameTheTensorAndTheRegion) {
  ShmObject in("bounds", 4096);
  ASSERT_TRUE(register_system("in", in.key(), 0, 1024).ok());
  const std::string head =
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, "
      "8] ";
  struct Case {
    std::string request;
    Code code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {shm_request("zz", 0, kPixelBytes), Code::not_found,
       "Unable to find shared memory region: 'zz'"},
      {shm_request("in", 1024, 4), Code::invalid_argument,
       "Invalid offset for shared memory region: 'in' (offset 1024, region of 1024 bytes)"},
      {shm_request("in", 512, kPixelBytes), Code::invalid_argument,
       "Invalid offset + byte size for shared memory region: 'in' (offset 512 + byte_size 768 > "
       "1024 bytes)"},
      {shm_request("in", 0, 700), Code::invalid_argument,
       "input 'pixel_values': shape [1,3,8,8] needs 768 bytes of FP32, got 700"},
      {shm_request("in", -4, 16), Code::invalid_argument,
       "tensor 'pixel_values': 'shared_memory_offset' must not be negative, got -4"},
      {head + "parameters { key: \"shared_memory_region\" value { string_param: \"in\" } } }",
       Code::invalid_argument,
       "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
       "for tensor 'pixel_values'"},
      {head + "parameters { key: \"shared_memory_region\" value { int64_param: 1 } } }",
       Code::invalid_argument,
       "invalid value type for 'shared_memory_region' parameter for tensor 'pixel_values', "
       "expected string_param."},
      {head + "parameters { key: \"shared_memory_region\" value { string_param: \"in\" } } "
              "parameters { key: \"shared_memory_byte_size\" value { double_param: 768 } } }",
       Code::invalid_argument,
       "invalid value type for 'shared_memory_byte_size' parameter for tensor 'pixel_values', "
       "expected int64_param."},
      {head + "parameters { key: \"shared_memory_offset\" value { int64_param: 0 } } }",
       Code::invalid_argument,
       "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
       "for tensor 'pixel_values'"},
      {head + shm_params("in", 0, kPixelBytes) + " contents { fp32_contents: [1] } }",
       Code::invalid_argument,
       "unexpected 'content' provided when using shared memory for input tensor 'pixel_values' "
       "for model 'fake'"},
  };
  for (const auto& c : cases) {
    const auto r = client_->infer(c.request);
    EXPECT_EQ(r.code, c.code) << c.request << ": " << r.message;
    EXPECT_EQ(r.message, c.message) << c.request;
  }
  // raw_input_contents counts only the inputs outside shared memory.
  const auto r = client_->infer(shm_request("in", 0, kPixelBytes), {std::string(4, '\0')});
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message, "raw_input_contents has 1 entries for 0 inputs outside shared memory");
  EXPECT_TRUE(FakeState::get().batches().empty());
  EXPECT_TRUE(client_->infer(shm_request("in", 0, kPixelBytes)).ok());
}

/// A client that shrinks its object (ftruncate) after registering it gets INVALID_ARGUMENT
/// naming the region, instead of a SIGBUS of the daemon when the mapping is read or written
/// (found by breaking the daemon from outside); an empty name and the region cap are refused.
TEST_F(Shm, ShrunkObjectsEmptyNamesAndTooManyRegionsAreRefused) {
  ShmObject in("shrink", 4096);
  ASSERT_TRUE(register_system("in", in.key(), 0, 4096).ok());
  {
    const int fd = ::shm_open(in.key().c_str(), O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ::close(fd);
  }
  auto r = client_->infer(shm_request("in", 0, kPixelBytes));
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message, "shared memory region 'in': its key '" + in.key() +
                           "' now holds 0 bytes, less than the offset + byte_size (4096 bytes) "
                           "it was registered with (register it again)");
  EXPECT_TRUE(FakeState::get().batches().empty());
  EXPECT_EQ(register_system("", in.key(), 0, 16).code, Code::invalid_argument);

  shm::Registry registry;
  ShmObject many("many", 4096);
  for (std::size_t i = 0; i < shm::kMaxRegions; ++i)
    registry.register_system("r" + std::to_string(i), many.key(), 0, 16);
  try {
    registry.register_system("one_more", many.key(), 0, 16);
    FAIL() << "region " << shm::kMaxRegions + 1 << " was registered";
  } catch (const api::Error& e) {
    EXPECT_EQ(e.code(), Code::resource_exhausted);
    EXPECT_STREQ(e.what(),
                 "too many shared memory regions: 1024 are registered (unregister some first)");
  }
  EXPECT_EQ(registry.unregister_system(""), static_cast<int>(shm::kMaxRegions));
  registry.register_system("one_more", many.key(), 0, 16);
}

/// A key names an object in /dev/shm ("/name" or "name"): a NUL byte (shm_open would open the
/// name before it), a '/' after the leading one or a '.' / '..' component is INVALID_ARGUMENT
/// naming the field `key`, before anything is opened.
TEST_F(Shm, KeysNameObjectsInDevShmOnly) {
  ShmObject obj("keys", 4096);
  const std::string head = "failed to register shared memory region 'k': field 'key' ";
  const std::string tail = " (expected \"/name\" or \"name\" of an object in /dev/shm)";
  struct Case {
    std::string key_text;  // text-format escaped
    std::string message;
  };
  const std::vector<Case> cases = {
      {obj.key() + "\\000/../etc",
       head + "contains a NUL byte at " + std::to_string(obj.key().size())},
      {"/../etc/passwd", head + "'/../etc/passwd' has a '/' after the leading one" + tail},
      {"/dev/shm/x", head + "'/dev/shm/x' has a '/' after the leading one" + tail},
      {"//x", head + "'//x' has a '/' after the leading one" + tail},
      {"a/b", head + "'a/b' has a '/' after the leading one" + tail},
      {"/..", head + "'/..' is a '.' or '..' component" + tail},
      {"..", head + "'..' is a '.' or '..' component" + tail},
      {"/.", head + "'/.' is a '.' or '..' component" + tail},
      {"/", head + "'/' names no object" + tail},
      {"", head + "'' names no object" + tail},
  };
  for (const auto& c : cases) {
    const auto r = call("SystemSharedMemoryRegister",
                        "name: \"k\" key: \"" + c.key_text + "\" offset: 0 byte_size: 16");
    EXPECT_EQ(r.code, Code::invalid_argument) << c.key_text << ": " << r.message;
    EXPECT_EQ(r.message, c.message) << c.key_text;
  }
  EXPECT_EQ(call("SystemSharedMemoryStatus", "").text, "");
  // Both spellings POSIX allows name the same object.
  EXPECT_TRUE(register_system("slash", obj.key(), 0, 16).ok());
  EXPECT_TRUE(register_system("bare", obj.key().substr(1), 0, 16).ok());
}

/// The client shrinks its object after the request bound its regions (the race a size check
/// alone leaves open): the input was copied at binding (pread) and the output is written with
/// pwrite, so the daemon never touches a mapping past the object's end (SIGBUS before: the
/// input viewed the mapping in place).
TEST(ShmRegistry, AnObjectShrunkAfterBindingIsNeverTouched) {
  ShmObject obj("late", 4096);
  for (int i = 0; i < 4096; ++i) obj.data()[i] = static_cast<char>(i % 251);
  const std::string want(obj.data() + 100, 768);
  shm::Registry registry;
  registry.register_system("r", obj.key(), 0, 4096);
  api::InputTensor t;
  t.name = "pixel_values";
  t.datatype = "FP32";
  std::vector<shm::View> held;
  shm::TensorShm p;
  p.used = true;
  p.region = "r";
  p.offset = 100;
  p.byte_size = 768;
  shm::bind_input(t, p, registry, held, "raw_input_contents");
  p.offset = 0;
  p.byte_size = 16;
  const auto out = shm::bind_output("scores", p, registry);
  {
    const int fd = ::shm_open(obj.key().c_str(), O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ::close(fd);
  }
  EXPECT_EQ(t.data(), want);  // read after the shrink: bytes of the copy, no fault
  const std::string shrunk = "shared memory region 'r': its key '" + obj.key() +
                             "' now holds 0 bytes, less than the offset + byte_size (4096 "
                             "bytes) it was registered with (register it again)";
  api::OutputTensor o;
  o.name = "scores";
  o.data = std::string(16, '\1');
  try {
    shm::write_output(o, out);
    FAIL() << "wrote into a shrunk object";
  } catch (const api::Error& e) {
    EXPECT_EQ(e.code(), Code::invalid_argument);
    EXPECT_EQ(std::string(e.what()), shrunk);
  }
  // Reading a view of the shrunk object: the same error (short pread), not a fault.
  try {
    shm::read(held.front());
    FAIL() << "read a shrunk object";
  } catch (const api::Error& e) {
    EXPECT_EQ(e.code(), Code::invalid_argument);
    EXPECT_EQ(std::string(e.what()), shrunk);
  }
}

/// An output larger than its region: INVALID_ARGUMENT naming the output, the region and both
/// sizes; nothing is written. A requested output whose region is unknown fails before the
/// model runs.
TEST_F(Shm, OutputLargerThanItsRegionIsAnError) {
  ShmObject in("oin", 4096), out("osmall", 4096);
  std::memset(out.data(), 0x7f, 64);
  ASSERT_TRUE(register_system("in", in.key(), 0, kPixelBytes).ok());
  ASSERT_TRUE(register_system("out", out.key(), 0, 64).ok());
  auto r = client_->infer(shm_request(
      "in", 0, kPixelBytes, "outputs { name: \"scores\" " + shm_params("out", 0, 8) + " }"));
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "shared memory size specified with the request for output 'scores' (8 bytes, region "
            "'out') should be at least 16 bytes to hold the results");
  EXPECT_EQ(out.data()[0], 0x7f) << "a failed call wrote into the region";
  EXPECT_EQ(FakeState::get().batches().size(), 1u);
  r = client_->infer(shm_request("in", 0, kPixelBytes,
                                 "outputs { name: \"scores\" " + shm_params("gone", 0, 8) + " }"));
  EXPECT_EQ(r.code, Code::not_found);
  EXPECT_EQ(r.message, "Unable to find shared memory region: 'gone'");
  r = client_->infer(shm_request("in", 0, kPixelBytes,
                                 "outputs { name: \"scores\" " + shm_params("out", 60, 16) + " }"));
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "Invalid offset + byte size for shared memory region: 'out' (offset 60 + byte_size 16 "
            "> 64 bytes)");
  EXPECT_EQ(FakeState::get().batches().size(), 1u) << "a bad output region reached the model";
}

/// Unregister while a request uses both regions: answered OK at once (deferred), the regions
/// leave the status (the names are free again), and the running request completes with its
/// input read and its output written into the mapping that stayed alive until it ended.
TEST_F(Shm, UnregisterWhileInUseIsDeferred) {
  ShmObject in("din", 4096), out("dout", 4096);
  for (std::size_t i = 0; i < kPixelBytes / 4; ++i) reinterpret_cast<float*>(in.data())[i] = 1.0f;
  ASSERT_TRUE(register_system("in", in.key(), 0, 4096).ok());
  ASSERT_TRUE(register_system("out", out.key(), 0, 4096).ok());
  FakeState::get().sleep_ms = 600;
  auto pending = client_->start_infer(shm_request(
      "in", 0, kPixelBytes, "outputs { name: \"scores\" " + shm_params("out", 0, 16) + " }"));
  ASSERT_TRUE(wait_forwards(1));
  const auto t0 = SteadyClock::now();
  EXPECT_TRUE(call("SystemSharedMemoryUnregister", "").ok());
  EXPECT_LT(since(t0), 0.3) << "unregister waited for the request";
  EXPECT_EQ(call("SystemSharedMemoryStatus", "").text, "");
  EXPECT_TRUE(register_system("in", in.key(), 0, 16).ok()) << "the name stayed taken";
  const auto r = pending->wait();
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(FakeState::get().sums(), std::vector<double>{192.0});
  const auto* scores = reinterpret_cast<const float*>(out.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(scores[i], kScore, 1e-6f) << i;
  // Using an unregistered region afterwards is NOT_FOUND.
  FakeState::get().sleep_ms = 0;
  const auto after = client_->infer(
      shm_request("in", 0, 16, "outputs { name: \"scores\" " + shm_params("out", 0, 16) + " }"));
  EXPECT_EQ(after.code, Code::not_found);
  EXPECT_EQ(after.message, "Unable to find shared memory region: 'out'");
}

// ---- cancellation and deadlines are notified -------------------------------------------------

/// A request queued behind a slow batch whose deadline passes is answered DEADLINE_EXCEEDED at
/// its deadline (the transport's timer notifies the core), leaves the queue then, never runs,
/// and the server counts it DEADLINE_EXCEEDED.
TEST_F(Shm, DeadlineOfAQueuedRequestIsNotified) {
  FakeState::get().sleep_ms = 1500;
  const std::string request =
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, "
      "8] } outputs { name: \"num_detections\" }";
  const std::string pixels(kPixelBytes, '\0');
  auto running = client_->start_infer(request, {pixels});
  ASSERT_TRUE(wait_forwards(1));
  // max_batch_size 4 with no delay: the second request waits for the worker.
  const auto t0 = SteadyClock::now();
  auto late = client_->start_infer(request, {pixels}, 0.3);
  const auto r = late->wait();
  const double waited = since(t0);
  EXPECT_EQ(r.code, Code::deadline_exceeded) << r.message;
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 1.2) << "answered at the end of the batch ahead, not at its deadline";
  EXPECT_TRUE(wait_pending(0)) << "the expired request still holds its queue slot";
  EXPECT_EQ(FakeState::get().batches().size(), 1u);
  EXPECT_TRUE(running->wait().ok());
  EXPECT_EQ(FakeState::get().batches(), std::vector<int64_t>{1}) << "the expired request ran";
  const auto end = SteadyClock::now() + std::chrono::seconds(5);
  while (sample(metrics(),
                "libreyolo_inference_requests_total{code=\"DEADLINE_EXCEEDED\",model=\"fake\","
                "version=\"1\"}") != 1 &&
         SteadyClock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sample(metrics(),
                   "libreyolo_inference_requests_total{code=\"DEADLINE_EXCEEDED\",model=\"fake\","
                   "version=\"1\"}"),
            1);
}

/// A client cancellation reaches the core while the request waits in the queue: it leaves the
/// queue within a bound far below the 1.5 s batch ahead.
TEST_F(Shm, CancellationOfAQueuedRequestIsNotified) {
  FakeState::get().sleep_ms = 1500;
  const std::string request =
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, 8, "
      "8] } outputs { name: \"num_detections\" }";
  const std::string pixels(kPixelBytes, '\0');
  auto running = client_->start_infer(request, {pixels});
  ASSERT_TRUE(wait_forwards(1));
  auto queued = client_->start_infer(request, {pixels});
  ASSERT_TRUE(wait_pending(1));
  const auto t0 = SteadyClock::now();
  queued->cancel();
  EXPECT_EQ(queued->wait().code, Code::cancelled);
  EXPECT_TRUE(wait_pending(0));
  EXPECT_LT(since(t0), 1.0) << "the queue slot was freed only when the batch ahead ended";
  EXPECT_EQ(FakeState::get().batches().size(), 1u);
  EXPECT_TRUE(running->wait().ok());
  EXPECT_EQ(FakeState::get().batches(), std::vector<int64_t>{1});
}

/// api::CancelToken: the first cancel() wins and runs every subscriber once with its reason; a
/// subscription after the cancellation runs at once; an unsubscribed callback never runs, and
/// unsubscribe() waits while cancel() runs the callbacks on another thread.
TEST(CancelToken, NotifiesOnceWithTheReason) {
  api::CancelToken token;
  EXPECT_FALSE(token.cancelled());
  EXPECT_EQ(token.reason(), Code::ok);
  int a = 0, b = 0;
  const int ida = token.subscribe([&] { ++a; });
  const int idb = token.subscribe([&] { ++b; });
  EXPECT_GT(ida, 0);
  token.unsubscribe(idb);
  token.cancel(Code::deadline_exceeded);
  token.cancel(Code::cancelled);  // ignored
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(token.reason(), Code::deadline_exceeded);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  int late = 0;
  EXPECT_EQ(token.subscribe([&] { ++late; }), 0);
  EXPECT_EQ(late, 1);

  api::CancelToken slow;
  std::atomic<bool> running{false}, returned{false};
  const int id = slow.subscribe([&] {
    running = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    returned = true;
  });
  std::thread canceller([&] { slow.cancel(); });
  while (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  slow.unsubscribe(id);
  EXPECT_TRUE(returned.load()) << "unsubscribe returned while the callback still ran";
  canceller.join();
}

// ---- stop with idle client channels ----------------------------------------------------------

/// Answers every call at once; nothing but ServerLive is used.
class IdleService : public api::InferenceService {
 public:
  bool live() const override { return true; }
  bool ready() const override { return true; }
  bool model_ready(const std::string&, const std::string&) const override { return true; }
  api::ServerMetadata server_metadata() const override { return {}; }
  api::ModelMetadata model_metadata(const std::string&, const std::string&) const override {
    return {};
  }
  api::ModelConfig model_config(const std::string&, const std::string&) const override {
    return {};
  }
  std::vector<api::ModelStatistics> model_statistics(const std::string&,
                                                     const std::string&) const override {
    return {};
  }
  std::vector<api::RepositoryEntry> repository_index(bool) const override { return {}; }
  void load_model(const std::string&) override {}
  void unload_model(const std::string&) override {}
  api::InferResponse infer(api::InferRequest&&) override { return {}; }
};

/// Four client channels connected and idle: shutdown(5 s grace) returns promptly (no call is
/// in flight, so nothing waits for the grace period).
TEST(ShmStop, StopWithIdleChannelsIsPrompt) {
  IdleService service;
  rpc::GrpcOptions options;
  options.address = "127.0.0.1:0";
  auto server = std::make_unique<rpc::GrpcServer>(service, options);
  std::vector<std::unique_ptr<rpc::Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<rpc::Client>("127.0.0.1:" + std::to_string(server->port())));
    ASSERT_TRUE(clients.back()->call("ServerLive").ok());
  }
  const auto t0 = SteadyClock::now();
  server->shutdown(5.0);
  const double s = since(t0);
  std::cout << "shutdown with 4 idle channels: " << s << " s\n";
  EXPECT_LT(s, 1.0);
}

/// An open grpc.health.v1 Watch stream (a call that never ends by itself) does not hold the
/// stop for the grace period: the server ends it (NOT_SERVING, then OK) and shuts down at once.
/// With gRPC's default health service, SIGTERM -> exit took the whole 30 s grace.
TEST(ShmStop, StopWithAHealthWatchOpenIsPrompt) {
  IdleService service;
  rpc::GrpcOptions options;
  options.address = "127.0.0.1:0";
  auto server = std::make_unique<rpc::GrpcServer>(service, options);
  server->set_ready(true);
  rpc::Client client("127.0.0.1:" + std::to_string(server->port()));
  std::atomic<int> messages{0};
  rpc::CallResult watched;
  std::thread watcher(
      [&] { watched = client.watch_health("readiness", 20.0, [&] { ++messages; }); });
  const auto t_wait = SteadyClock::now();
  while (messages.load() == 0 && since(t_wait) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(messages.load(), 1);
  server->set_ready(false);  // a change reaches the watcher
  while (messages.load() < 2 && since(t_wait) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server->set_ready(true);
  while (messages.load() < 3 && since(t_wait) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = SteadyClock::now();
  server->shutdown(5.0);
  const double s = since(t0);
  watcher.join();
  std::cout << "shutdown with a health Watch open: " << s << " s\n";
  EXPECT_LT(s, 1.0);
  EXPECT_EQ(watched.code, Code::ok) << watched.message;
  EXPECT_EQ(watched.text, "SERVING NOT_SERVING SERVING NOT_SERVING");
}

}  // namespace
}  // namespace libreyolo::server
