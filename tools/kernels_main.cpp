// libreyolo-kernels: resolves every kernel slot under the effective policy (config file +
// environment) and prints the table, as the daemon does at start-up.
//
//   libreyolo-kernels [--config FILE] [--json]
// Exit codes: 0 ok, 1 policy error, 2 usage error.
#include <chrono>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/kernels.h"
#include "kernels/policy.h"
#include "log/log.h"

namespace {

using libreyolo::kernels::Policy;
using libreyolo::kernels::Registry;
using libreyolo::kernels::source_name;

template <class T, class S>
nlohmann::json setting(const T& value, const S& s) {
  nlohmann::json j;
  j["value"] = value;
  j["source"] = source_name(s.source);
  if (!s.origin.empty()) j["origin"] = s.origin;
  return j;
}

std::string iso8601(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json to_json(const Policy& p, Registry& r) {
  nlohmann::json j;
  auto& pol = j["policy"];
  pol["selection"] = setting(p.selection.value, p.selection);
  pol["hub_kernels"] = setting(p.hub_kernels.value, p.hub_kernels);
  pol["fused_attention"] =
      setting(libreyolo::kernels::fused_attention_name(p.fused_attention.value), p.fused_attention);
  for (const auto& [slot, allow] : p.slot_allow)
    pol["slots"][slot]["allow"] = setting(allow.value, allow);
  j["slots"] = nlohmann::json::object();
  for (const auto& s : r.report()) {
    auto& js = j["slots"][s.slot];
    js["selected"] = s.selected;
    js["has_reference"] = s.has_reference;
    js["candidates"] = nlohmann::json::array();
    for (const auto& c : s.candidates) {
      js["candidates"].push_back({{"name", c.name},
                                  {"allowed", c.allowed},
                                  {"eligible", c.eligible},
                                  {"reason", c.reason},
                                  {"disabled", c.disabled},
                                  {"calls", c.calls},
                                  {"declined", c.declined}});
    }
  }
  j["events"] = nlohmann::json::array();
  for (const auto& e : r.events()) {
    j["events"].push_back(
        {{"slot", e.slot}, {"impl", e.impl}, {"reason", e.reason}, {"time", iso8601(e.time)}});
  }
  j["providers_loaded"] = r.loaded_providers();
  j["built_with_cuda"] = libreyolo::kernels::built_with_cuda();
  return j;
}

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
  auto& registry = Registry::global();
  registry.set_filter(policy.filter());
  registry.resolve();
  if (json) {
    std::cout << to_json(policy, registry).dump(2) << "\n";
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
