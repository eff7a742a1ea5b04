// The state of one model in the repository, as Triton's model repository manager names them
// (RepositoryIndex `state`, /active). No torch in this header.
#pragma once

namespace libreyolo::server {

/// UNKNOWN: scanned, not asked to load yet; LOADING: loading or warming up; READY: serving;
/// UNLOADING: taken out of service, requests it already accepted still running;
/// UNAVAILABLE: not serving (failed, unloaded, never loaded in explicit mode), with a reason.
enum class ModelState { unknown, loading, ready, unloading, unavailable };

/// "UNKNOWN", "LOADING", "READY", "UNLOADING", "UNAVAILABLE".
constexpr const char* state_name(ModelState s) {
  switch (s) {
    case ModelState::unknown:
      return "UNKNOWN";
    case ModelState::loading:
      return "LOADING";
    case ModelState::ready:
      return "READY";
    case ModelState::unloading:
      return "UNLOADING";
    case ModelState::unavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

}  // namespace libreyolo::server
