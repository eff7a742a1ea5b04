// libreyolo-kernels: resolves every kernel slot under the effective policy (config file +
// environment) and prints the table, as the daemon does at start-up.
//
//   libreyolo-kernels [--config FILE] [--json]
// Exit codes: 0 ok, 1 policy error, 2 usage error.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/kernels.h"
#include "kernels/policy.h"
#include "kernels/report_json.h"
#include "log/log.h"

namespace {

using libreyolo::kernels::Policy;
using libreyolo::kernels::Registry;

}  // namespace

int main(int argc, char** argv) {
  std::string config;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: libreyolo-kernels [--config FILE] [--json]\n";
      return 0;
    } else {
      std::cerr << "libreyolo-kernels: unknown argument '" << a
                << "'\nusage: libreyolo-kernels [--config FILE] [--json]\n";
      return 2;
    }
  }
  if (json) libreyolo::log::set_level(libreyolo::log::Level::warn);
  const auto env = libreyolo::kernels::process_environment();
  Policy policy;
  try {
    policy = config.empty() ? libreyolo::kernels::policy_from_environment(env)
                            : libreyolo::kernels::load_policy_file(config, env);
  } catch (const libreyolo::kernels::PolicyError& e) {
    std::cerr << "libreyolo-kernels: " << e.what() << "\n";
    return 1;
  }
  auto& registry = Registry::process_default();
  try {
    libreyolo::kernels::apply_policy(registry, policy);
  } catch (const libreyolo::kernels::PolicyError& e) {
    std::cerr << "libreyolo-kernels: " << e.what() << "\n";
    return 1;
  }
  if (json) {
    std::cout << libreyolo::kernels::kernels_json(registry, policy,
                                                  libreyolo::kernels::built_with_cuda())
                     .dump(2)
              << "\n";
  } else {
    std::cout << "policy:\n"
              << policy.describe() << "\nslots:\n"
              << libreyolo::kernels::format_table(registry.report());
    for (const auto& e : registry.events()) {
      std::cout << "fallback event: " << e.slot << "/" << e.impl << ": " << e.reason << "\n";
    }
  }
  return 0;
}
