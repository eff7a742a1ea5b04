#include "kernels/report_json.h"

#include <ctime>

namespace libreyolo::kernels {
namespace {

std::string iso8601(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json candidates_json(const std::vector<CandidateReport>& candidates) {
  auto out = nlohmann::json::array();
  for (const auto& c : candidates) {
    out.push_back({{"name", c.name},
                   {"allowed", c.allowed},
                   {"eligible", c.eligible},
                   {"reason", c.reason},
                   {"disabled", c.disabled},
                   {"calls", c.calls},
                   {"declined", c.declined}});
  }
  return out;
}

}  // namespace

nlohmann::json kernels_json(Registry& registry, const Policy& p, bool built_with_cuda) {
  nlohmann::json j;
  auto& pol = j["policy"];
  pol["selection"] = setting_json(p.selection.value, p.selection);
  pol["hub_kernels"] = setting_json(p.hub_kernels.value, p.hub_kernels);
  pol["fused_attention"] =
      setting_json(std::string(fused_attention_name(p.fused_attention.value)), p.fused_attention);
  pol["layouts"] = setting_json(std::string(layout_mode_name(p.layouts.value)), p.layouts);
  pol["slots"] = nlohmann::json::object();
  for (const auto& [slot, allow] : p.slot_allow)
    pol["slots"][slot]["allow"] = setting_json(allow.value, allow);
  j["active"] = registry.active();
  j["slots"] = nlohmann::json::object();
  for (const auto& s : registry.report()) {
    j["slots"][s.slot] = {{"signature", s.signature},
                          {"selected", s.selected},
                          {"has_reference", s.has_reference},
                          {"candidates", candidates_json(s.candidates)}};
  }
  j["bindings"] = nlohmann::json::object();
  for (const auto& b : registry.bindings()) {
    // Instances of one model (the server's instance_group) each report their own handles.
    j["bindings"][b.instance.empty() ? b.model : b.instance][b.slot] = {
        {"selected", b.selected}, {"candidates", candidates_json(b.candidates)}};
  }
  j["providers"] = nlohmann::json::array();
  for (const auto& pr : registry.providers())
    j["providers"].push_back({{"name", pr.name}, {"state", pr.state}, {"detail", pr.detail}});
  j["fallback_events"] = nlohmann::json::array();
  for (const auto& e : registry.events()) {
    j["fallback_events"].push_back({{"slot", e.slot},
                                    {"impl", e.impl},
                                    {"model", e.model},
                                    {"reason", e.reason},
                                    {"time", iso8601(e.time)}});
  }
  j["built_with_cuda"] = built_with_cuda;
  return j;
}

}  // namespace libreyolo::kernels
