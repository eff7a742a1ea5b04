// Who may call which API: Triton's restricted protocols (`--grpc-restricted-protocol`,
// `--http-restricted-api`, docs/user_guide/inference_protocols.md "Limit Endpoint Access") as a
// value the transports consult per call. Plain C++: no gRPC, httplib or torch type.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace libreyolo::server::security {

/// The API groups a rule applies to. Triton's protocol names where Triton has the group
/// (health, metadata, inference, shared-memory, model-config, model-repository, statistics),
/// plus `admin` for this daemon's /active and `metrics` for /metrics (apart, so that a scraper
/// such as a PodMonitor, which cannot send a header, can be let in where /active is not).
enum class ApiGroup : int {
  health,            ///< ServerLive/Ready, ModelReady, grpc.health.v1, /v2/health/*
  metadata,          ///< ServerMetadata, ModelMetadata, GET /v2, GET /v2/models/M
  inference,         ///< ModelInfer, POST .../infer
  shared_memory,     ///< system and CUDA shared-memory status/register/unregister
  model_config,      ///< ModelConfig, GET .../config
  model_repository,  ///< repository index, load, unload
  statistics,        ///< ModelStatistics, GET .../stats
  admin,             ///< GET /active (HTTP only)
  metrics,           ///< GET /metrics (HTTP only); server.yaml without a `metrics` rule gives
                     ///< it the `admin` rule (server/config/config.cpp), as before the split
};
inline constexpr int kApiGroups = 9;

/// The group's name as written in server.yaml ("shared-memory", "model-repository", ...).
const char* group_name(ApiGroup group);

/// The group named `name` (Triton's spelling, e.g. "shared-memory"); nullopt for an unknown name.
std::optional<ApiGroup> parse_group(std::string_view name);

/// Every group name, comma-separated, for error messages.
std::string group_names();

/// How calls of one group are let in.
struct AccessRule {
  enum class Kind {
    open,      ///< everyone
    loopback,  ///< only peers on the loopback interface (127.0.0.0/8, ::1, Unix sockets)
    header,    ///< only calls carrying header `header` with exactly `value`
  };
  Kind kind = Kind::open;
  std::string header;  ///< lower case (gRPC metadata keys are; HTTP header names compare
                       ///< case-insensitively)
  std::string value;
  /// The environment variable `value` was read from (server.yaml's value_env), shown by
  /// --print-config instead of the value; "" when the value was written in the file.
  std::string value_env;
  /// The group whose rule this is when server.yaml did not set this group's own (`metrics`
  /// takes `admin`'s), said by --print-config; "" otherwise.
  std::string inherited_from;
};

/// The transport a denied call came over (the metric's `protocol` label).
enum class Protocol : int { grpc, http };

/// One rule per group (server.restricted_apis). Defaults: every group open but shared-memory,
/// which is loopback-only: a region is a name in the server host's /dev/shm (or a CUDA IPC
/// handle of its GPUs), only meaningful to a client on the same host, and registering one is
/// how a remote caller would make the daemon map memory it names.
class AccessRules {
 public:
  AccessRules();
  /// Sets the rule of `group` (its header name lower-cased).
  void set(ApiGroup group, AccessRule rule);
  const AccessRule& rule(ApiGroup group) const { return rules_[static_cast<std::size_t>(group)]; }

 private:
  std::array<AccessRule, kApiGroups> rules_;
};

/// The rules in force and the calls they denied; shared by the transports (not copyable).
class AccessPolicy {
 public:
  explicit AccessPolicy(AccessRules rules = {}) : rules_(std::move(rules)) {}
  AccessPolicy(const AccessPolicy&) = delete;
  AccessPolicy& operator=(const AccessPolicy&) = delete;

  const AccessRule& rule(ApiGroup group) const { return rules_.rule(group); }

  /// Looks a request header up by lower-case name; nullopt when absent.
  using HeaderLookup = std::function<std::optional<std::string>(const std::string& name)>;

  /// Empty when the call may proceed, else the message to answer with (gRPC PERMISSION_DENIED,
  /// HTTP 403), e.g. "This API is restricted, expecting header 'admin-key'" (Triton's text).
  /// Counts each denial (denied()). The value comparison does not stop at the first differing
  /// byte, so its time does not tell a caller how much of a guess was right.
  std::string check(ApiGroup group, Protocol protocol, const HeaderLookup& header,
                    bool loopback_peer) const;

  /// Calls denied so far.
  std::uint64_t denied(ApiGroup group, Protocol protocol) const;

 private:
  const AccessRules rules_;
  mutable std::array<std::atomic<std::uint64_t>, kApiGroups * 2> denied_{};
};

/// Whether a peer address is on the loopback interface. Accepts gRPC's peer strings
/// ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000", "unix:/path") and plain
/// addresses ("127.0.0.1", "::1", "::ffff:127.0.0.1"). Anything else, "" included, is not.
bool is_loopback_peer(std::string_view peer);

/// Whether a listen address ("host:port", "[v6]:port") only accepts loopback connections:
/// "localhost", 127.0.0.0/8 or ::1. "0.0.0.0", "[::]", a host name or "" are not.
bool is_loopback_address(std::string_view address);

}  // namespace libreyolo::server::security
