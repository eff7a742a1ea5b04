// libFuzzer target: config/server.yaml as the daemon reads it (server/config/config.cpp
// parse_config, with the `kernels:` policy parser of kernels/policy.cpp), then the
// --print-config text of the result (describe), which must read back. Every input either parses
// or throws ConfigError whose message starts with the file name; a describe() that does not read
// back, any other exception or a crash is a bug. Seed corpus: tests/fuzz/corpus/server_yaml/
// (config/server.yaml, the examples', the tests' hostile values).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/config/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::server;
  const std::string file = "/etc/libreyolo/server.yaml";
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The environment the CI and the daemon's tests use; the environment parser has its own unit
  // tests (tests/unit/registry_policy_test.cpp).
  const libreyolo::kernels::Environment env = {{"LIBREYOLO_HUB_KERNELS", "0"}};
  ServerConfig config;
  try {
    config = parse_config(text, file, {}, env);
  } catch (const ConfigError& e) {
    libreyolo::fuzz::expect_message(e.what(), file);
    return 0;
  }
  const std::string printed = describe(config);
  try {
    const ServerConfig again = parse_config(printed, file, {}, env);
    if (describe(again).size() == 0) libreyolo::fuzz::fail("empty describe()");
  } catch (const ConfigError& e) {
    libreyolo::fuzz::fail(std::string("describe() does not read back: ") + e.what() +
                          "\n--- printed:\n" + printed);
  }
  return 0;
}
