// The daemon's hardening: server.max_concurrent_rpcs (config, --print-config, /active),
// --print-config as YAML that load_config reads back to the same values, zero series of the
// kernel counters from the first scrape, the pixel_values bound per model, and --help of the
// programs (stdout, exit 0; unknown flags: stderr, exit 2).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kernels/registry.h"
#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/tasks/image_inputs.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

const std::string kFixtures = LIBREYOLO_TEST_FIXTURES;

std::string config_error(const std::string& yaml) {
  try {
    parse_config(yaml, "bad.yaml", {}, {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

struct Run {
  int code = -1;
  std::string out, err;
};

/// Runs bin/<program> with each argument list at once (LibTorch's start-up is paid in
/// parallel); stdout and stderr captured apart.
std::vector<Run> run_programs(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& runs) {
  const auto dir = temp_dir("help");
  std::vector<pid_t> pids;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string bin = std::string(LIBREYOLO_BINARY_DIR) + "/bin/" + runs[i].first;
    const std::string out = (dir / (std::to_string(i) + ".out")).string();
    const std::string err = (dir / (std::to_string(i) + ".err")).string();
    // The child would write the parent's unflushed output a second time (freopen flushes).
    std::cout.flush();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr))
        std::_Exit(126);
      std::vector<std::string> copy = runs[i].second;
      std::string b = bin;
      std::vector<char*> argv{b.data()};
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(b.c_str(), argv.data());
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<Run> results(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    results[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    results[i].out = read_file((dir / (std::to_string(i) + ".out")).string());
    results[i].err = read_file((dir / (std::to_string(i) + ".err")).string());
  }
  remove_tree(dir);
  return results;
}

bool built(const std::string& program) {
  return ::access((std::string(LIBREYOLO_BINARY_DIR) + "/bin/" + program).c_str(), X_OK) == 0;
}

// ---- server.max_concurrent_rpcs ---------------------------------------------------------------

TEST(ServerHardenConfig, MaxConcurrentRpcsKeyBoundsAndOrigin) {
  const auto d = parse_config("", "", {}, {});
  EXPECT_EQ(d.max_concurrent_rpcs.value, 256);
  EXPECT_EQ(d.max_concurrent_rpcs.source, Source::default_value);
  const auto c = parse_config("server:\n  max_concurrent_rpcs: 12\n", "s.yaml", {}, {});
  EXPECT_EQ(c.max_concurrent_rpcs.value, 12);
  EXPECT_EQ(c.max_concurrent_rpcs.origin, "s.yaml:2:24");
  EXPECT_NE(describe(c).find("  max_concurrent_rpcs: 12  # s.yaml:2:24\n"), std::string::npos)
      << describe(c);
  for (const char* v : {"0", "1", "-5", "4097", "100000000000"}) {
    EXPECT_EQ(config_error(std::string("server:\n  max_concurrent_rpcs: ") + v + "\n"),
              "bad.yaml:2:24: server.max_concurrent_rpcs must be between 2 and 4096")
        << v;
  }
  EXPECT_EQ(config_error("server:\n  max_concurrent_rpcs: many\n"),
            "bad.yaml:2:24: server.max_concurrent_rpcs must be an integer, got 'many'");
  EXPECT_EQ(config_error("server:\n  max_concurrent_rpcs: [4]\n"),
            "bad.yaml:2:24: server.max_concurrent_rpcs must be an integer");
  EXPECT_EQ(parse_config("server:\n  max_concurrent_rpcs: 4096\n", "s.yaml", {}, {})
                .max_concurrent_rpcs.value,
            4096);
  // The shipped file documents the key with its default.
  const auto shipped =
      load_config(std::string(LIBREYOLO_SOURCE_DIR) + "/config/server.yaml", {}, {});
  EXPECT_EQ(shipped.max_concurrent_rpcs.value, 256);
  EXPECT_EQ(shipped.max_concurrent_rpcs.source, Source::file);
}

/// The configured value reaches the daemon: with max_concurrent_rpcs 4 and 300 ms forwards,
/// 16 concurrent calls get RESOURCE_EXHAUSTED for most; /active shows the value and its origin.
TEST(ServerHardenConfig, MaxConcurrentRpcsCapsTheDaemonAndShowsInActive) {
  const auto repo = temp_dir("rpcs");
  add_fake_model(repo, "fake", "max_batch_size: 16\nmax_queue_delay_microseconds: 0\n");
  auto config = loopback_config(repo, "cpu", "server:\n  max_concurrent_rpcs: 4\n");
  Daemon d(config, fake_or_real());
  d.start();
  FakeState::get().reset();
  FakeState::get().sleep_ms = 300;
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  const auto results = c.infer_concurrently(
      "model_name: \"fake\" inputs { name: \"pixel_values\" datatype: "
      "\"FP32\" shape: [1, 3, 8, 8] }",
      {std::string(3 * 8 * 8 * 4, '\0')}, 16);
  int ok = 0, exhausted = 0;
  std::string other;
  for (const auto& r : results) {
    if (r.ok())
      ++ok;
    else if (r.code == Code::resource_exhausted)
      ++exhausted;
    else
      other += std::string(api::code_name(r.code)) + ": " + r.message + "; ";
  }
  std::cout << "16 concurrent calls, max_concurrent_rpcs 4: " << ok << " OK, " << exhausted
            << " RESOURCE_EXHAUSTED\n";
  EXPECT_EQ(other, "");
  EXPECT_GE(ok, 1);
  EXPECT_GE(exhausted, 8);
  FakeState::get().reset();
  const auto active = nlohmann::json::parse(http_get(d.http_port(), "/active").body);
  EXPECT_EQ(active["server"]["max_concurrent_rpcs"],
            (nlohmann::json{{"value", 4}, {"source", "file"}, {"origin", "test.yaml:2:24"}}))
      << active["server"].dump();
  EXPECT_EQ(active["server"]["max_pixels_per_image"]["value"], 40000000);
  EXPECT_EQ(active["server"]["max_pixels_per_image"]["source"], "default");
  d.stop(1.0);
  remove_tree(repo);
}

// ---- --print-config round trip ------------------------------------------------------------------

/// Every value of two configurations, compared one by one (sources are not: the printed file
/// is a new origin).
void expect_same_values(const ServerConfig& a, const ServerConfig& b) {
  EXPECT_EQ(a.grpc_address.value, b.grpc_address.value);
  EXPECT_EQ(a.http_address.value, b.http_address.value);
  EXPECT_EQ(a.drain_seconds.value, b.drain_seconds.value);
  EXPECT_EQ(a.max_message_bytes.value, b.max_message_bytes.value);
  EXPECT_EQ(a.max_images_per_request.value, b.max_images_per_request.value);
  EXPECT_EQ(a.max_pixels_per_image.value, b.max_pixels_per_image.value);
  EXPECT_EQ(a.preprocess_threads.value, b.preprocess_threads.value);
  EXPECT_EQ(a.intra_op_threads.value, b.intra_op_threads.value);
  EXPECT_EQ(a.max_concurrent_rpcs.value, b.max_concurrent_rpcs.value);
  EXPECT_EQ(a.model_control.value, b.model_control.value);
  EXPECT_EQ(a.log_level.value, b.log_level.value);
  EXPECT_EQ(a.strict_readiness.value, b.strict_readiness.value);
  EXPECT_EQ(a.gpu_image_decode.value, b.gpu_image_decode.value);
  // The same folder: --print-config shows paths absolute (a relative one in a file is relative
  // to the file's folder, so the printed file reads back to that folder from anywhere).
  EXPECT_EQ(absolute_path(a.model_repository.value), absolute_path(b.model_repository.value));
  EXPECT_EQ(a.device.value, b.device.value);
  EXPECT_EQ(a.dtype.value, b.dtype.value);
  EXPECT_EQ(a.tf32.value, b.tf32.value);
  EXPECT_EQ(a.cudnn_benchmark.value, b.cudnn_benchmark.value);
  const auto &k = a.kernels, &l = b.kernels;
  EXPECT_EQ(k.selection.value, l.selection.value);
  EXPECT_EQ(k.hub_kernels.value, l.hub_kernels.value);
  EXPECT_EQ(k.fused_attention.value, l.fused_attention.value);
  EXPECT_EQ(k.layouts.value, l.layouts.value);
  ASSERT_EQ(k.slot_allow.size(), l.slot_allow.size());
  for (const auto& [slot, names] : k.slot_allow) {
    ASSERT_TRUE(l.slot_allow.count(slot)) << slot;
    EXPECT_EQ(names.value, l.slot_allow.at(slot).value) << slot;
  }
  EXPECT_EQ(k.hub.endpoint.value, l.hub.endpoint.value);
  EXPECT_EQ(absolute_path(k.hub.cache_dir.value), absolute_path(l.hub.cache_dir.value));
  EXPECT_EQ(k.hub.offline.value, l.hub.offline.value);
  EXPECT_EQ(absolute_path(k.hub.lock_file.value), absolute_path(l.hub.lock_file.value));
  EXPECT_EQ(k.hub.timeout_seconds.value, l.hub.timeout_seconds.value);
  EXPECT_EQ(k.hub.token, l.hub.token);
}

TEST(ServerHardenConfig, PrintConfigIsYamlThatReadsBackToTheSameValues) {
  const kernels::Environment env = {{"LIBREYOLO_HUB_KERNELS", "0"},
                                    {"HF_ENDPOINT", "https://mirror.example/hf #1: a"},
                                    {"HF_TOKEN", "hf_secret_token"}};
  const std::string yaml =
      "server:\n"
      "  grpc_address: 127.0.0.1:9001\n"
      "  http_address: \"off\"\n"
      "  drain_seconds: 0.125\n"
      "  max_message_bytes: 1048576\n"
      "  max_images_per_request: 3\n"
      "  max_pixels_per_image: 123456\n"
      "  preprocess_threads: 7\n"
      "  intra_op_threads: 5\n"
      "  max_concurrent_rpcs: 33\n"
      "  model_control: explicit\n"
      "  log_level: warn\n"
      "  strict_readiness: false\n"
      "  gpu_image_decode: on\n"
      "model_repository: \"/tmp/odd repo #2: x\\\"q\\\\ '\"\n"
      "device: cuda:3\n"
      "tf32: off\n"
      "cudnn_benchmark: false\n"
      "kernels:\n"
      "  selection: reference\n"
      "  fused_attention: on\n"
      "  slots:\n"
      "    ms_deform_attn: {allow: [cuda, hub]}\n"
      "    attention: {allow: []}\n"
      "  hub:\n"
      "    cache_dir: /var/cache/k\n"
      "    offline: true\n"
      "    timeout_seconds: 2.5\n"
      "dtype: bfloat16\n";
  for (const auto& [text, file] : std::vector<std::pair<std::string, std::string>>{
           {yaml, "/etc/libreyolo/server.yaml"}, {"", ""}}) {
    const auto original = parse_config(text, file, {}, env);
    const auto printed = describe(original);
    std::cout << printed;
    EXPECT_EQ(printed.find("hf_secret_token"), std::string::npos) << "the token was printed";
    // Plain YAML (yaml-cpp), a mapping of the four top-level keys... and the daemon's parser.
    const YAML::Node root = YAML::Load(printed);
    ASSERT_TRUE(root.IsMap());
    EXPECT_TRUE(root["kernels"]["hub"].IsMap());
    const auto again = parse_config(printed, "printed.yaml", {}, env);
    expect_same_values(original, again);
    // Printing the re-read configuration gives the same values again (sources aside).
    expect_same_values(again, parse_config(describe(again), "printed2.yaml", {}, env));
  }
  // A non-finite timeout prints as YAML's .inf and reads back.
  const auto inf = parse_config("kernels:\n  hub:\n    timeout_seconds: .inf\n", "i.yaml", {}, {});
  EXPECT_NE(describe(inf).find("    timeout_seconds: .inf  # i.yaml:3:22\n"), std::string::npos)
      << describe(inf);
  EXPECT_EQ(parse_config(describe(inf), "j.yaml", {}, {}).kernels.hub.timeout_seconds.value,
            inf.kernels.hub.timeout_seconds.value);
  const auto c = parse_config(yaml, "/etc/libreyolo/server.yaml", {}, env);
  const auto text = describe(c);
  EXPECT_NE(text.find("model_repository: \"/tmp/odd repo #2: x\\\"q\\\\ '\"  # "
                      "/etc/libreyolo/server.yaml:15:19\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  hub_kernels: false  # environment LIBREYOLO_HUB_KERNELS\n"),
            std::string::npos);
  EXPECT_NE(text.find("    endpoint: \"https://mirror.example/hf #1: a\"  # environment "
                      "HF_ENDPOINT\n"),
            std::string::npos);
  // The origin of a slot's list is its key (the check of its names points there).
  EXPECT_NE(text.find("    ms_deform_attn:\n      allow: [cuda, hub]  # "
                      "/etc/libreyolo/server.yaml:23:5\n"),
            std::string::npos);
  EXPECT_NE(text.find("  layouts: default  # default\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  # hub token: set (environment HF_TOKEN)\n"), std::string::npos);
  EXPECT_NE(text.find("    lock_file: \"\"  # default (empty: /etc/libreyolo/kernels.lock, next "
                      "to the configuration file)\n"),
            std::string::npos);
}

/// The binary's --print-config output is a configuration file: load_config reads it back to
/// the values the binary read (flags included).
TEST(ServerHardenConfig, PrintConfigOfTheBinaryLoadsBack) {
  if (!built("libreyolo-server")) GTEST_SKIP() << "libreyolo-server not built";
  const auto dir = temp_dir("print-roundtrip");
  write_file(dir / "s.yaml",
             "server:\n  drain_seconds: 3\n  max_concurrent_rpcs: 99\n"
             "kernels:\n  slots:\n    fake_quant_fp8: {allow: [reference]}\n");
  const auto runs = run_programs({{"libreyolo-server",
                                   {"--config", (dir / "s.yaml").string(), "--grpc-address",
                                    "127.0.0.1:7", "--print-config"}}});
  ASSERT_EQ(runs[0].code, 0) << runs[0].err;
  write_file(dir / "printed.yaml", runs[0].out);
  const auto env = kernels::process_environment();
  Overrides flags;
  flags.grpc_address = "127.0.0.1:7";
  const auto read = load_config((dir / "s.yaml").string(), flags, env);
  const auto printed = load_config((dir / "printed.yaml").string(), {}, env);
  expect_same_values(read, printed);
  EXPECT_EQ(printed.max_concurrent_rpcs.value, 99);
  EXPECT_EQ(printed.grpc_address.value, "127.0.0.1:7");
  EXPECT_EQ(printed.kernels.slot_allow.at("fake_quant_fp8").value,
            std::vector<std::string>{"reference"});
  remove_tree(dir);
}

// ---- kernel counters: zero series ---------------------------------------------------------------

/// Every (slot, implementation) pair the registry knows at start-up has a declined and a
/// fallback series from the first scrape, before any event (reason="none", always 0).
TEST(ServerHardenMetrics, KernelCountersHaveZeroSeriesForEveryKnownPair) {
  const auto repo = temp_dir("zero-series");
  add_fake_model(repo, "fake", "");
  Daemon d(loopback_config(repo), fake_or_real());
  d.start();
  const auto body = http_get(d.http_port(), "/metrics").body;
  int pairs = 0;
  for (const auto& slot : kernels::Registry::process_default().report()) {
    for (const auto& c : slot.candidates) {
      ++pairs;
      for (const char* family :
           {"libreyolo_kernel_declined_total", "libreyolo_kernel_fallback_total"}) {
        const std::string line = std::string(family) + "{slot=\"" + slot.slot + "\",impl=\"" +
                                 c.name + "\",reason=\"none\"} 0\n";
        EXPECT_NE(body.find(line), std::string::npos) << "missing " << line << " in\n" << body;
      }
      const std::string oom =
          "libreyolo_kernel_oom_total{slot=\"" + slot.slot + "\",impl=\"" + c.name + "\"} 0\n";
      EXPECT_NE(body.find(oom), std::string::npos) << "missing " << oom << " in\n" << body;
    }
  }
  std::cout << pairs << " (slot, impl) pairs with zero series\n";
  // The reference implementation of fake_quant_fp8 exists on every machine.
  EXPECT_NE(body.find("libreyolo_kernel_declined_total{slot=\"fake_quant_fp8\",impl=\"reference\","
                      "reason=\"none\"} 0\n"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("libreyolo_kernel_fallback_total{slot=\"fake_quant_fp8\",impl=\"reference\","
                      "reason=\"none\"} 0\n"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("# TYPE libreyolo_kernel_fallback_total counter\n"), std::string::npos);
  EXPECT_GE(pairs, 1);
  d.stop(1.0);
  remove_tree(repo);
}

// ---- the pixel_values bound
// -----------------------------------------------------------------------

TEST(ServerHardenPixels, ModelPixelLimitFromTheProcessorSize) {
  EXPECT_EQ(model_pixel_limit(224, 224, 0, 0, true),
            std::make_pair(int64_t{200704}, std::string("4 x the model's 224x224 input size, "
                                                        "preprocessor_config.json size")));
  EXPECT_EQ(model_pixel_limit(640, 480, 0, 0, true).first, 4 * 640 * 480);
  // Deformable DETR: shortest_edge 800, longest_edge 1333.
  EXPECT_EQ(model_pixel_limit(0, 0, 800, 1333, true),
            std::make_pair(int64_t{4 * 1333 * 1333},
                           std::string("4 x the square of the model's longest_edge 1333, "
                                       "preprocessor_config.json size")));
  EXPECT_EQ(model_pixel_limit(0, 0, 800, 0, true).first, 0);  // long side unbounded
  EXPECT_EQ(model_pixel_limit(224, 224, 0, 0, false).first, 0);
  EXPECT_EQ(model_pixel_limit(int64_t{1} << 40, 224, 0, 0, true).first, 0);
}

/// A 4096x4096 pixel_values to a ViT (224x224) is INVALID_ARGUMENT naming the input, its shape
/// and the limit, before the tensor is allocated; 448x448 (the limit) runs. The same bound holds
/// for detectors (the fake's RT-DETR processor: 640x640).
TEST(ServerHardenPixels, PixelValuesBeyondTheModelsBoundAreInvalidArgument) {
  const auto repo = temp_dir("pixels");
  add_fake_model(repo, "fake", "");
  add_fixture_model(repo, "vit_tiny", "vit_tiny", "warmup: false\n");
  Daemon d(loopback_config(repo), fake_or_real());
  d.start();
  rpc::Client c("127.0.0.1:" + std::to_string(d.grpc_port()));
  auto request = [](const std::string& model, int64_t h, int64_t w) {
    return "model_name: \"" + model +
           "\" inputs { name: \"pixel_values\" datatype: \"FP32\" shape: [1, 3, " +
           std::to_string(h) + ", " + std::to_string(w) + "] }";
  };
  auto r = c.infer(request("vit_tiny", 4096, 4096), {std::string()});
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "input 'pixel_values': shape [1,3,4096,4096]: 4096x4096 = 16777216 pixels per image "
            "exceed the model's limit of 200704 (4 x the model's 224x224 input size, "
            "preprocessor_config.json size)");
  r = c.infer(request("vit_tiny", 449, 448), {std::string()});
  EXPECT_EQ(r.code, Code::invalid_argument) << r.message;
  const auto at_limit = std::string(3 * 448 * 448 * 4, '\0');
  r = c.infer(request("vit_tiny", 448, 448), {at_limit});
  EXPECT_TRUE(r.ok()) << api::code_name(r.code) << ": " << r.message;
  r = c.infer(request("fake", 1281, 1280), {std::string()});
  EXPECT_EQ(r.code, Code::invalid_argument);
  EXPECT_EQ(r.message,
            "input 'pixel_values': shape [1,3,1281,1280]: 1280x1281 = 1639680 pixels per image "
            "exceed the model's limit of 1638400 (4 x the model's 640x640 input size, "
            "preprocessor_config.json size)");
  // server.max_pixels_per_image still comes first, with its own message.
  r = c.infer(request("fake", 8000, 8000), {std::string()});
  EXPECT_EQ(r.message,
            "input 'pixel_values': 8000x8000 pixels per image exceed the limit of 40000000");
  d.stop(1.0);
  remove_tree(repo);
}

// ---- --help of the programs
// ----------------------------------------------------------------------

TEST(ServerHardenPrograms, HelpOnStdoutExitZeroUnknownFlagOnStderrExitTwo) {
  const std::map<std::string, std::string> usage = {
      {"libreyolo-client", "usage: libreyolo-client detect --image FILE"},
      {"libreyolo-server", "usage: libreyolo-server [--config FILE]"},
      {"libreyolo-predict", "usage: libreyolo-predict --model DIR"},
      {"libreyolo-kernels-hub", "usage: libreyolo-kernels-hub lock|download|verify"}};
  std::vector<std::pair<std::string, std::vector<std::string>>> runs;
  std::vector<std::string> first;  // the usage line each run must show
  std::vector<int> want;           // its exit status: 0 with the usage on stdout, 2 on stderr
  for (const auto& [program, line] : usage) {
    if (!built(program)) {
      std::cout << program << " not built: skipped\n";
      continue;
    }
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--help"}, {"-h"}, {"--no-such-flag"}}) {
      runs.push_back({program, args});
      first.push_back(line);
      want.push_back(args[0] == "--no-such-flag" ? 2 : 0);
    }
  }
  if (built("libreyolo-client")) {
    // A sub-command takes --help as well; no argument at all is a usage error.
    runs.push_back({"libreyolo-client", {"detect", "--help"}});
    first.push_back("usage: libreyolo-client");
    want.push_back(0);
    runs.push_back({"libreyolo-client", {}});
    first.push_back("usage: libreyolo-client");
    want.push_back(2);
    // A value that is not a number is named with its flag before the usage.
    runs.push_back({"libreyolo-client", {"detect", "--image", "a.jpg", "--nms-threshold", "0.5x"}});
    first.push_back("--nms-threshold needs a number, got '0.5x'\nusage: libreyolo-client");
    want.push_back(2);
  }
  if (runs.empty()) GTEST_SKIP() << "no program built";
  const auto results = run_programs(runs);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string what = runs[i].first;
    for (const auto& a : runs[i].second) what += " " + a;
    const auto& r = results[i];
    EXPECT_EQ(r.code, want[i]) << what << ": " << r.err;
    const std::string& shown = want[i] == 0 ? r.out : r.err;
    const std::string& silent = want[i] == 0 ? r.err : r.out;
    EXPECT_NE(shown.find(first[i]), std::string::npos) << what << ": " << shown;
    if (want[i] == 0) EXPECT_EQ(shown.rfind(first[i], 0), 0u) << what << ": " << shown;
    EXPECT_EQ(silent, "") << what;
  }
  std::cout << runs.size() << " runs checked\n";
}

}  // namespace
}  // namespace libreyolo::server
