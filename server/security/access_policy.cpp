#include "server/security/access_policy.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>

#include <cctype>
#include <cstring>

namespace libreyolo::server::security {
namespace {

constexpr std::array<const char*, kApiGroups> kNames = {
    "health",           "metadata",   "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "admin",     "metrics"};

/// Equal contents, in time that depends on the lengths only (OpenSSL's CRYPTO_memcmp).
bool same_secret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool loopback_ip(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;  // 127.0.0.0/8
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  static const unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (std::memcmp(v6.s6_addr, kLoopback6, 16) == 0) return true;
  // ::ffff:127.x.y.z, an IPv4 peer on a dual-stack socket.
  static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(v6.s6_addr, kMapped, 12) == 0 && v6.s6_addr[12] == 127;
}

/// "%5B" / "%5D" -> "[" / "]" (gRPC percent-encodes the brackets of IPv6 peers).
std::string unescape_brackets(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && s[i + 1] == '5' &&
        (s[i + 2] == 'B' || s[i + 2] == 'b')) {
      out += '[';
      i += 2;
    } else if (s[i] == '%' && i + 2 < s.size() && s[i + 1] == '5' &&
               (s[i + 2] == 'D' || s[i + 2] == 'd')) {
      out += ']';
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

/// "host:port" / "[v6]:port" -> host; a bare address (no port) unchanged.
std::string host_of(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string::npos ? address : address.substr(0, close + 1);
  }
  const auto colon = address.find(':');
  // More than one colon and no brackets: a bare IPv6 address.
  if (colon == std::string::npos || address.find(':', colon + 1) != std::string::npos)
    return address;
  return address.substr(0, colon);
}

}  // namespace

const char* group_name(ApiGroup group) { return kNames[static_cast<std::size_t>(group)]; }

std::optional<ApiGroup> parse_group(std::string_view name) {
  for (int i = 0; i < kApiGroups; ++i) {
    if (name == kNames[static_cast<std::size_t>(i)]) return static_cast<ApiGroup>(i);
  }
  return std::nullopt;
}

std::string group_names() {
  std::string out;
  for (const char* n : kNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

AccessRules::AccessRules() {
  rules_[static_cast<std::size_t>(ApiGroup::shared_memory)].kind = AccessRule::Kind::loopback;
}

void AccessRules::set(ApiGroup group, AccessRule rule) {
  for (auto& c : rule.header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  rules_[static_cast<std::size_t>(group)] = std::move(rule);
}

std::string AccessPolicy::check(ApiGroup group, Protocol protocol, const HeaderLookup& header,
                                bool loopback_peer) const {
  const AccessRule& r = rule(group);
  std::string why;
  switch (r.kind) {
    case AccessRule::Kind::open:
      return {};
    case AccessRule::Kind::loopback:
      if (loopback_peer) return {};
      why = std::string("This API is restricted to clients on the server's host (") +
            group_name(group) + ": loopback; server.restricted_apis)";
      break;
    case AccessRule::Kind::header: {
      const auto got = header ? header(r.header) : std::nullopt;
      if (got && same_secret(*got, r.value)) return {};
      why = "This API is restricted, expecting header '" + r.header + "'";
      break;
    }
  }
  denied_[static_cast<std::size_t>(group) * 2 + static_cast<std::size_t>(protocol)]++;
  return why;
}

std::uint64_t AccessPolicy::denied(ApiGroup group, Protocol protocol) const {
  return denied_[static_cast<std::size_t>(group) * 2 + static_cast<std::size_t>(protocol)].load();
}

bool is_loopback_peer(std::string_view peer) {
  if (peer.rfind("unix:", 0) == 0 || peer.rfind("unix-abstract:", 0) == 0) return true;
  std::string s = unescape_brackets(peer);
  if (s.rfind("ipv4:", 0) == 0) {
    s = s.substr(5);
    return loopback_ip(host_of(s));
  }
  if (s.rfind("ipv6:", 0) == 0) {
    s = s.substr(5);
    return loopback_ip(host_of(s));
  }
  return !s.empty() && loopback_ip(s);
}

bool is_loopback_address(std::string_view address) {
  const std::string a(address);
  if (a.empty()) return false;
  return loopback_ip(host_of(a));
}

}  // namespace libreyolo::server::security
