// The one JSON form of the kernel state, shared by `/active` (server/core) and
// `libreyolo-kernels --json` (tools/kernels_main.cpp), so both name everything the same way.
//
// {
//   "policy": {"selection": {"value", "source", "origin"}, "hub_kernels": ..., "fused_attention":
//              ..., "layouts": ..., "slots": {"<slot>": {"allow": {...}}}},
//   "active": {"<slot>": "<impl>" | "unavailable"},
//   "slots": {"<slot>": {"signature", "selected", "has_reference", "candidates": [
//              {"name", "allowed", "eligible", "reason", "disabled", "calls", "declined": {}}]}},
//   "bindings": {"<model>": {"<slot>": {"selected", "candidates": [...]}}}, per-model handles
//   "providers": [{"name", "state", "detail"}],
//   "fallback_events": [{"slot", "impl", "model", "reason", "time"}],        time: ISO 8601 UTC
//   "built_with_cuda": bool
// }
#pragma once

#include <nlohmann/json.hpp>

#include "kernels/policy.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {

/// {"value", "source", "origin"} of one policy setting.
template <class T, class V>
nlohmann::json setting_json(const V& value, const Setting<T>& s) {
  return {{"value", value}, {"source", source_name(s.source)}, {"origin", s.origin}};
}

/// The document above for `registry` under `policy`. `built_with_cuda`: kernels::built_with_cuda()
/// (passed in: this library has no torch).
nlohmann::json kernels_json(Registry& registry, const Policy& policy, bool built_with_cuda);

}  // namespace libreyolo::kernels
