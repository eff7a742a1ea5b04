// TLS, mutual TLS and restricted APIs (server.tls, server.restricted_apis) against the real
// daemon on loopback: certificates made at test time by the openssl command (a test CA, a
// server certificate for localhost/127.0.0.1, a client certificate, and a second CA nobody
// trusts), the gRPC client through grpc::SslCredentials and the HTTPS side through OpenSSL.
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "server/app/daemon.h"
#include "server/config/config.h"
#include "server/grpc/client.h"
#include "server/security/access_policy.h"
#include "server/security/tls.h"
#include "server_test_support.h"

namespace libreyolo::server {
namespace {

using namespace testing;
using api::Code;

/// Runs a shell command in `dir`; fails the test (and returns false) when it does not exit 0.
bool sh(const fs::path& dir, const std::string& cmd) {
  const std::string full = "cd '" + dir.string() + "' && " + cmd + " >/dev/null 2>&1";
  const int rc = std::system(full.c_str());
  EXPECT_EQ(rc, 0) << full;
  return rc == 0;
}

/// A CA `name` (name.key, name.crt) and, signed by it, a certificate `leaf` (leaf.key,
/// leaf.crt) with subjectAltName `san` ("" for a client certificate).
void make_ca(const fs::path& dir, const std::string& name) {
  sh(dir, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
              name + ".key -out " + name + ".crt -days 2 -subj /CN=" + name);
}
void make_leaf(const fs::path& dir, const std::string& ca, const std::string& leaf,
               const std::string& san) {
  write_file(dir / (leaf + ".ext"),
             san.empty() ? "extendedKeyUsage=clientAuth\n" : "subjectAltName=" + san + "\n");
  sh(dir, "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + leaf +
              ".key -out " + leaf + ".csr -subj /CN=" + leaf);
  sh(dir, "openssl x509 -req -in " + leaf + ".csr -CA " + ca + ".crt -CAkey " + ca +
              ".key -CAcreateserial -out " + leaf + ".crt -days 2 -extfile " + leaf + ".ext");
}

/// One HTTPS exchange (HTTP/1.1, Connection: close) through OpenSSL, verifying the server
/// against `ca` and presenting `cert`/`key` when given.
struct HttpsResult {
  std::string handshake_error;  ///< "" when the handshake succeeded
  int status = 0;
  std::string body;
};
HttpsResult https_get(int port, const std::string& path, const fs::path& ca,
                      const fs::path& cert = {}, const fs::path& key = {},
                      const std::string& extra_headers = "") {
  HttpsResult out;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        &SSL_CTX_free);
  SSL_CTX_load_verify_locations(ctx.get(), ca.c_str(), nullptr);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!cert.empty()) {
    SSL_CTX_use_certificate_file(ctx.get(), cert.c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    out.handshake_error = "connect failed";
    return out;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  SSL* ssl = SSL_new(ctx.get());
  SSL_set_fd(ssl, fd);
  SSL_set_tlsext_host_name(ssl, "localhost");
  SSL_set1_host(ssl, "localhost");
  ERR_clear_error();
  if (SSL_connect(ssl) != 1) {
    const unsigned long e = ERR_get_error();
    out.handshake_error = e ? ERR_reason_error_string(e) : "handshake failed";
  } else {
    const std::string req = "GET " + path +
                            " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" +
                            extra_headers + "\r\n";
    SSL_write(ssl, req.data(), static_cast<int>(req.size()));
    std::string raw;
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) raw.append(buf, static_cast<std::size_t>(n));
    if (raw.empty()) {
      // TLS 1.3: a refused client certificate is reported after the client's handshake ended.
      const unsigned long e = ERR_get_error();
      out.handshake_error = e ? ERR_reason_error_string(e) : "no answer";
    } else {
      out.status = std::atoi(raw.substr(9, 3).c_str());
      const auto body = raw.find("\r\n\r\n");
      out.body = body == std::string::npos ? "" : raw.substr(body + 4);
    }
  }
  SSL_free(ssl);
  ::close(fd);
  return out;
}

rpc::ClientTls client_tls(const fs::path& dir, const std::string& leaf = "") {
  rpc::ClientTls t;
  t.root_certificates = read_file((dir / "ca.crt").string());
  if (!leaf.empty()) {
    t.private_key = read_file((dir / (leaf + ".key")).string());
    t.certificate_chain = read_file((dir / (leaf + ".crt")).string());
  }
  t.server_name = "localhost";
  return t;
}

/// Certificates for every test of the file, made once, removed at exit.
class Certificates {
 public:
  static const fs::path& dir() {
    static const Certificates made;
    return made.dir_;
  }
  ~Certificates() { remove_tree(dir_); }

 private:
  Certificates() : dir_(temp_dir("tls")) {
    make_ca(dir_, "ca");
    make_leaf(dir_, "ca", "server", "DNS:localhost,IP:127.0.0.1");
    make_leaf(dir_, "ca", "client", "");
    make_ca(dir_, "rogue");
    make_leaf(dir_, "rogue", "intruder", "");
    make_ca(dir_, "ca2");
    make_leaf(dir_, "ca2", "server2", "DNS:localhost,IP:127.0.0.1");
  }
  const fs::path dir_;
};

std::string tls_yaml(const fs::path& d, bool mutual) {
  std::string y = "server:\n  tls:\n    cert_file: " + (d / "live.crt").string() +
                  "\n    key_file: " + (d / "live.key").string() + "\n";
  if (mutual) y += "    client_ca_file: " + (d / "ca.crt").string() + "\n";
  return y;
}

/// A daemon serving the fake detector `fake` with the server.yaml text `yaml`.
class FakeDaemonTest : public ::testing::Test {
 protected:
  void start_daemon(const std::string& yaml) {
    repo_ = temp_dir("security-repo");
    add_fake_model(repo_, "fake", "max_batch_size: 1\n");
    daemon_ = std::make_unique<Daemon>(loopback_config(repo_, "cpu", yaml), fake_or_real());
    daemon_->start();
    grpc_ = "127.0.0.1:" + std::to_string(daemon_->grpc_port());
  }
  void TearDown() override {
    daemon_.reset();
    remove_tree(repo_);
  }
  fs::path repo_;
  std::unique_ptr<Daemon> daemon_;
  std::string grpc_;
};

/// The daemon with TLS from the `server` certificate (copied to live.crt / live.key, which a
/// test may replace).
class ServerTls : public FakeDaemonTest {
 protected:
  void start(bool mutual) {
    const fs::path& d = Certificates::dir();
    fs::copy_file(d / "server.crt", d / "live.crt", fs::copy_options::overwrite_existing);
    fs::copy_file(d / "server.key", d / "live.key", fs::copy_options::overwrite_existing);
    start_daemon(tls_yaml(d, mutual));
  }
};

TEST_F(ServerTls, GrpcAndHttpsServeOverTlsAndPlainTextIsRefused) {
  start(false);
  const fs::path& d = Certificates::dir();
  rpc::Client secure(grpc_, 16 << 20, client_tls(d));
  const auto live = secure.call("ServerLive");
  EXPECT_EQ(live.code, Code::ok) << live.message;
  EXPECT_EQ(live.text, "live: true\n");
  EXPECT_EQ(secure.health("readiness").text, "SERVING");

  rpc::Client plain(grpc_);
  const auto refused = plain.call("ServerLive", "", 3.0);
  EXPECT_EQ(refused.code, Code::unavailable) << refused.message;

  const auto h = https_get(daemon_->http_port(), "/v2/health/live", d / "ca.crt");
  EXPECT_EQ(h.handshake_error, "");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "{\"live\":true}");
  // A plain-text request to the HTTPS port gets no HTTP answer.
  const auto p = http_request(daemon_->http_port(), "GET", "/v2/health/live");
  EXPECT_EQ(p.status, 0);
}

// libreyolo-client --tls-server-name: the name checked against the server's certificate when the
// address does not carry it (a probe dialling an IP, a certificate for a Service's DNS name).
TEST_F(ServerTls, ClientToolChecksTheServerNameItIsGiven) {
  start(false);
  const fs::path& d = Certificates::dir();
  const std::string log = (repo_ / "client.log").string();
  auto health = [&](const std::string& name) {
    const std::string cmd = std::string(LIBREYOLO_BINARY_DIR) +
                            "/bin/libreyolo-client health --service readiness --server " + grpc_ +
                            " --tls-ca " + (d / "ca.crt").string() + " --tls-server-name " + name +
                            " > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log));
  };
  // The certificate names localhost and 127.0.0.1.
  const auto ok = health("localhost");
  EXPECT_EQ(ok.first, 0) << ok.second;
  EXPECT_EQ(ok.second, "SERVING\n");
  const auto wrong = health("other.example");
  EXPECT_EQ(wrong.first, 1) << wrong.second;
  EXPECT_EQ(wrong.second.rfind("error: UNAVAILABLE: ", 0), 0u) << wrong.second;
  // Without a CA the name has nothing to check against: a usage error.
  const std::string cmd = std::string(LIBREYOLO_BINARY_DIR) +
                          "/bin/libreyolo-client health --server " + grpc_ +
                          " --tls-server-name localhost > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2);
  EXPECT_EQ(read_file(log).rfind("--tls-ca is needed with TLS, and --tls-cert and --tls-key go "
                                 "together\n",
                                 0),
            0u)
      << read_file(log);
}

TEST_F(ServerTls, MutualTlsRefusesClientsWithoutACertificateTheCaSigned) {
  start(true);
  const fs::path& d = Certificates::dir();
  rpc::Client with_cert(grpc_, 16 << 20, client_tls(d, "client"));
  EXPECT_EQ(with_cert.call("ServerLive").code, Code::ok);
  rpc::Client without(grpc_, 16 << 20, client_tls(d));
  EXPECT_EQ(without.call("ServerLive", "", 3.0).code, Code::unavailable);
  rpc::Client intruder(grpc_, 16 << 20, client_tls(d, "intruder"));
  EXPECT_EQ(intruder.call("ServerLive", "", 3.0).code, Code::unavailable);

  const int port = daemon_->http_port();
  const auto ok =
      https_get(port, "/v2/health/ready", d / "ca.crt", d / "client.crt", d / "client.key");
  EXPECT_EQ(ok.handshake_error, "");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "{\"ready\":true}");
  const auto none = https_get(port, "/v2/health/ready", d / "ca.crt");
  EXPECT_EQ(none.status, 0);
  EXPECT_NE(none.handshake_error, "");
  const auto rogue =
      https_get(port, "/v2/health/ready", d / "ca.crt", d / "intruder.crt", d / "intruder.key");
  EXPECT_EQ(rogue.status, 0);
  EXPECT_NE(rogue.handshake_error, "");
}

TEST_F(ServerTls, ReloadServesTheRenewedCertificateToNewConnections) {
  start(false);
  const fs::path& d = Certificates::dir();
  const int port = daemon_->http_port();
  EXPECT_EQ(https_get(port, "/v2/health/live", d / "ca.crt").status, 200);
  // Renewal by another CA: new connections must present the new certificate.
  fs::copy_file(d / "server2.crt", d / "live.crt", fs::copy_options::overwrite_existing);
  fs::copy_file(d / "server2.key", d / "live.key", fs::copy_options::overwrite_existing);
  daemon_->reload_certificates();
  const auto renewed = https_get(port, "/v2/health/live", d / "ca2.crt");
  EXPECT_EQ(renewed.handshake_error, "");
  EXPECT_EQ(renewed.status, 200);
  EXPECT_EQ(https_get(port, "/v2/health/live", d / "ca.crt").handshake_error,
            "certificate verify failed");
  // Files that cannot be used keep the previous certificate.
  write_file(d / "live.key", "not a key\n");
  daemon_->reload_certificates();
  EXPECT_EQ(https_get(port, "/v2/health/live", d / "ca2.crt").status, 200);
}

TEST(ServerTlsConfig, AKeyThatDoesNotMatchTheCertificateFailsTheStartUp) {
  const fs::path& d = Certificates::dir();
  fs::copy_file(d / "server.crt", d / "live.crt", fs::copy_options::overwrite_existing);
  fs::copy_file(d / "client.key", d / "live.key", fs::copy_options::overwrite_existing);
  const fs::path repo = temp_dir("tls-bad");
  Daemon daemon(loopback_config(repo, "cpu", tls_yaml(d, false)), fake_or_real());
  try {
    daemon.start();
    ADD_FAILURE() << "started";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("TLS: key file " + (d / "live.key").string() +
                             " does not match certificate file " + (d / "live.crt").string(),
                         0),
              0u)
        << what;
  }
  remove_tree(repo);
}

TEST(ServerTlsConfig, PathsAreRelativeToTheFileAndIncompleteSectionsAreRefused) {
  const auto c = parse_config("server:\n  tls:\n    cert_file: tls/s.crt\n    key_file: s.key\n",
                              "/etc/libreyolo/server.yaml", {}, {});
  EXPECT_EQ(c.tls.value.cert_file, "/etc/libreyolo/tls/s.crt");
  EXPECT_EQ(c.tls.value.key_file, "/etc/libreyolo/s.key");
  EXPECT_FALSE(c.tls.value.mutual());
  try {
    parse_config("server:\n  tls:\n    cert_file: s.crt\n", "f.yaml", {}, {});
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:3:5: server.tls needs both cert_file and key_file");
  }
  try {
    parse_config("server:\n  tls:\n    cert: s.crt\n", "f.yaml", {}, {});
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "f.yaml:3:5: unknown key server.tls.cert (expected cert_file, key_file, "
                 "client_ca_file)");
  }
}

// --- restricted APIs ---------------------------------------------------------------------

TEST(RestrictedApisConfig, RulesParseAndBadOnesAreRefused) {
  const auto c = parse_config(
      "server:\n  restricted_apis:\n    model-repository: {header: Admin-Key, value: s3cret}\n"
      "    shared-memory: open\n    admin: {header: admin-key, value_env: LIBREYOLO_ADMIN_KEY}\n",
      "f.yaml", {}, {{"LIBREYOLO_ADMIN_KEY", "from-env"}});
  const auto& r = c.restricted_apis.value;
  EXPECT_EQ(r.rule(security::ApiGroup::model_repository).kind, security::AccessRule::Kind::header);
  EXPECT_EQ(r.rule(security::ApiGroup::model_repository).header, "admin-key");
  EXPECT_EQ(r.rule(security::ApiGroup::model_repository).value, "s3cret");
  EXPECT_EQ(r.rule(security::ApiGroup::shared_memory).kind, security::AccessRule::Kind::open);
  EXPECT_EQ(r.rule(security::ApiGroup::admin).value, "from-env");
  EXPECT_EQ(r.rule(security::ApiGroup::inference).kind, security::AccessRule::Kind::open);
  // --print-config never shows a secret.
  const std::string printed = describe(c);
  EXPECT_EQ(printed.find("s3cret"), std::string::npos);
  EXPECT_EQ(printed.find("from-env"), std::string::npos);
  EXPECT_NE(printed.find("    model-repository: {header: admin-key, value: \"(not shown)\"}\n"),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("    admin: {header: admin-key, value_env: LIBREYOLO_ADMIN_KEY}\n"),
            std::string::npos);
  // No metrics rule: /metrics keeps admin's, as when it was in the admin group, and says so.
  EXPECT_EQ(r.rule(security::ApiGroup::metrics).kind, security::AccessRule::Kind::header);
  EXPECT_EQ(r.rule(security::ApiGroup::metrics).value, "from-env");
  EXPECT_NE(printed.find("    metrics: {header: admin-key, value_env: LIBREYOLO_ADMIN_KEY}  # "
                         "admin's rule (not set)\n"),
            std::string::npos)
      << printed;
  // Its own rule wins; the printed file reads back to the same rules.
  const auto own = parse_config(
      "server:\n  restricted_apis:\n    admin: {header: admin-key, value: s3cret}\n"
      "    metrics: loopback\n",
      "f.yaml", {}, {});
  EXPECT_EQ(own.restricted_apis.value.rule(security::ApiGroup::metrics).kind,
            security::AccessRule::Kind::loopback);
  EXPECT_NE(describe(own).find("    metrics: loopback\n"), std::string::npos) << describe(own);
  const auto none =
      parse_config("server:\n  restricted_apis:\n    health: open\n", "f.yaml", {}, {});
  EXPECT_EQ(none.restricted_apis.value.rule(security::ApiGroup::metrics).kind,
            security::AccessRule::Kind::open);

  const std::pair<std::string, std::string> bad[] = {
      {"server:\n  restricted_apis:\n    trace: open\n",
       "f.yaml:3:5: unknown API group 'trace' in server.restricted_apis (expected health, "
       "metadata, inference, shared-memory, model-config, model-repository, statistics, admin, "
       "metrics)"},
      {"server:\n  restricted_apis:\n    admin: closed\n",
       "f.yaml:3:12: server.restricted_apis.admin must be open, loopback or {header: NAME, "
       "value: VALUE}, got 'closed'"},
      {"server:\n  restricted_apis:\n    admin: {header: grpc-timeout, value: x}\n",
       "f.yaml:3:21: server.restricted_apis.admin.header must be 1 to 64 letters, digits, '-' "
       "or '_', and not a header the protocols reserve (host, content-*, te, grpc-*, ...), got "
       "'grpc-timeout'"},
      {"server:\n  restricted_apis:\n    admin: {header: k}\n",
       "f.yaml:3:12: server.restricted_apis.admin needs header and value (or value_env)"},
      {"server:\n  restricted_apis:\n    admin: {header: k, value_env: LIBREYOLO_UNSET}\n",
       "f.yaml:3:35: server.restricted_apis.admin.value_env: the environment variable "
       "LIBREYOLO_UNSET is not set"},
      {"server:\n  restricted_apis:\n    admin: {header: k, value_env: ADMIN_KEY}\n",
       "f.yaml:3:35: server.restricted_apis.admin.value_env must name a LIBREYOLO_* environment "
       "variable, got 'ADMIN_KEY'"},
  };
  for (const auto& [yaml, message] : bad) {
    try {
      parse_config(yaml, "f.yaml", {}, {});
      ADD_FAILURE() << yaml;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

TEST(AccessPolicy, LoopbackPeersAndHeaderValues) {
  EXPECT_TRUE(security::is_loopback_peer("ipv4:127.0.0.1:5000"));
  EXPECT_TRUE(security::is_loopback_peer("ipv4:127.3.2.1:1"));
  EXPECT_TRUE(security::is_loopback_peer("ipv6:[::1]:5000"));
  EXPECT_TRUE(security::is_loopback_peer("ipv6:%5B::1%5D:5000"));
  EXPECT_TRUE(security::is_loopback_peer("ipv6:[::ffff:127.0.0.1]:80"));
  EXPECT_TRUE(security::is_loopback_peer("unix:/tmp/s"));
  EXPECT_TRUE(security::is_loopback_peer("127.0.0.1"));
  EXPECT_TRUE(security::is_loopback_peer("::1"));
  EXPECT_FALSE(security::is_loopback_peer("ipv4:10.0.0.7:5000"));
  EXPECT_FALSE(security::is_loopback_peer("ipv6:[2001:db8::1]:5000"));
  EXPECT_FALSE(security::is_loopback_peer("ipv6:[::ffff:10.0.0.1]:80"));
  EXPECT_FALSE(security::is_loopback_peer("192.168.1.2"));
  EXPECT_FALSE(security::is_loopback_peer(""));
  EXPECT_TRUE(security::is_loopback_address("127.0.0.1:8001"));
  EXPECT_TRUE(security::is_loopback_address("localhost:8001"));
  EXPECT_TRUE(security::is_loopback_address("[::1]:8001"));
  EXPECT_FALSE(security::is_loopback_address("0.0.0.0:8001"));
  EXPECT_FALSE(security::is_loopback_address("[::]:8001"));
  EXPECT_FALSE(security::is_loopback_address(":8001"));

  security::AccessRules rules;
  rules.set(security::ApiGroup::admin, {security::AccessRule::Kind::header, "Admin-Key", "s3cret"});
  security::AccessPolicy policy(rules);
  auto headers = [](std::optional<std::string> v) {
    return [v](const std::string& name) -> std::optional<std::string> {
      return name == "admin-key" ? v : std::nullopt;
    };
  };
  using security::ApiGroup;
  using security::Protocol;
  // Shared memory: loopback only by default.
  EXPECT_EQ(policy.check(ApiGroup::shared_memory, Protocol::grpc, headers({}), true), "");
  EXPECT_EQ(policy.check(ApiGroup::shared_memory, Protocol::grpc, headers({}), false),
            "This API is restricted to clients on the server's host (shared-memory: loopback; "
            "server.restricted_apis)");
  EXPECT_EQ(policy.check(ApiGroup::inference, Protocol::http, headers({}), false), "");
  EXPECT_EQ(policy.check(ApiGroup::admin, Protocol::http, headers("s3cret"), false), "");
  EXPECT_EQ(policy.check(ApiGroup::admin, Protocol::http, headers("s3cre"), true),
            "This API is restricted, expecting header 'admin-key'");
  EXPECT_EQ(policy.check(ApiGroup::admin, Protocol::http, headers({}), true),
            "This API is restricted, expecting header 'admin-key'");
  EXPECT_EQ(policy.denied(ApiGroup::admin, Protocol::http), 2u);
  EXPECT_EQ(policy.denied(ApiGroup::shared_memory, Protocol::grpc), 1u);
  EXPECT_EQ(policy.denied(ApiGroup::admin, Protocol::grpc), 0u);
}

/// `method path` (body `body`) without a header: HTTP 403 with Triton's text naming admin-key.
void expect_needs_admin_key(int port, const std::string& method, const std::string& path,
                            const std::string& body = "") {
  const auto r = http_request(port, method, path, body);
  EXPECT_EQ(r.status, 403) << method << " " << path;
  EXPECT_EQ(r.body, "{\"error\":\"This API is restricted, expecting header 'admin-key'\"}")
      << method << " " << path;
}

/// The daemon with model-repository and admin restricted to header admin-key: s3cret.
class SecuredDaemon : public FakeDaemonTest {
 protected:
  void SetUp() override {
    start_daemon(
        "server:\n  restricted_apis:\n"
        "    model-repository: {header: admin-key, value: s3cret}\n"
        "    admin: {header: admin-key, value: s3cret}\n");
  }
};

TEST_F(SecuredDaemon, ARestrictedGroupNeedsItsHeaderTheOthersStayOpen) {
  rpc::Client anonymous(grpc_);
  const auto denied = anonymous.call("RepositoryIndex");
  EXPECT_EQ(denied.code, Code::permission_denied);
  EXPECT_EQ(denied.message, "This API is restricted, expecting header 'admin-key'");
  rpc::Client wrong(grpc_);
  wrong.add_metadata("admin-key", "guess");
  EXPECT_EQ(wrong.call("RepositoryIndex").code, Code::permission_denied);
  rpc::Client admin(grpc_);
  admin.add_metadata("admin-key", "s3cret");
  const auto index = admin.call("RepositoryIndex");
  EXPECT_EQ(index.code, Code::ok) << index.message;
  EXPECT_NE(index.text.find("name: \"fake\""), std::string::npos) << index.text;
  // Health, metadata and inference stay open.
  EXPECT_EQ(anonymous.call("ServerLive").code, Code::ok);
  EXPECT_EQ(anonymous.call("ModelMetadata", "name: \"fake\"").code, Code::ok);

  const int port = daemon_->http_port();
  expect_needs_admin_key(port, "POST", "/v2/repository/index", "{}");
  auto r = http_request(port, "POST", "/v2/repository/index", "{}", {"Admin-Key: s3cret"});
  EXPECT_EQ(r.status, 200);
  expect_needs_admin_key(port, "GET", "/metrics");
  r = http_request(port, "GET", "/v2/health/ready");
  EXPECT_EQ(r.status, 200);
  r = http_request(port, "GET", "/metrics", "", {"admin-key: s3cret"});
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(
      r.body.find("libreyolo_api_denied_total{group=\"model-repository\",protocol=\"grpc\"} 2"),
      std::string::npos)
      << r.body;
  EXPECT_NE(
      r.body.find("libreyolo_api_denied_total{group=\"model-repository\",protocol=\"http\"} 1"),
      std::string::npos);
  // GET /metrics without the header: counted as the metrics group (its rule is admin's here).
  EXPECT_NE(r.body.find("libreyolo_api_denied_total{group=\"metrics\",protocol=\"http\"} 1"),
            std::string::npos);
  EXPECT_NE(r.body.find("libreyolo_api_denied_total{group=\"admin\",protocol=\"http\"} 0"),
            std::string::npos);
  EXPECT_NE(r.body.find("libreyolo_api_denied_total{group=\"inference\",protocol=\"grpc\"} 0"),
            std::string::npos);
}

/// /active behind a header, /metrics open: what a PodMonitor (no headers) scrapes.
class MetricsOpenDaemon : public FakeDaemonTest {
 protected:
  void SetUp() override {
    start_daemon(
        "server:\n  restricted_apis:\n"
        "    admin: {header: admin-key, value: s3cret}\n"
        "    metrics: open\n");
  }
};

TEST_F(MetricsOpenDaemon, MetricsAnswerWithoutTheHeaderActiveDoesNot) {
  const int port = daemon_->http_port();
  expect_needs_admin_key(port, "GET", "/active");
  auto r = http_request(port, "GET", "/active", "", {"admin-key: s3cret"});
  EXPECT_EQ(r.status, 200);
  r = http_request(port, "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("libreyolo_api_denied_total{group=\"admin\",protocol=\"http\"} 1"),
            std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find("libreyolo_api_denied_total{group=\"metrics\",protocol=\"http\"} 0"),
            std::string::npos);
}

TEST_F(SecuredDaemon, SmugglingFramesAreRefusedAndRangesIgnored) {
  const int port = daemon_->http_port();
  auto r = http_request(port, "POST", "/v2/repository/index", "{}",
                        {"admin-key: s3cret", "Content-Length: 2", "Content-Length: 3"}, false);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "{\"error\":\"differing Content-Length headers\"}");
  r = http_request(port, "POST", "/v2/repository/index", "2\r\n{}\r\n0\r\n\r\n",
                   {"admin-key: s3cret", "Content-Length: 2", "Transfer-Encoding: chunked"}, false);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body,
            "{\"error\":\"Content-Length and Transfer-Encoding together are not accepted\"}");
  // The same length twice is one length.
  r = http_request(port, "POST", "/v2/repository/index", "{}",
                   {"admin-key: s3cret", "Content-Length: 2", "Content-Length: 2"}, false);
  EXPECT_EQ(r.status, 200);
  r = http_request(port, "GET", "/v2/health/live", "", {"Range: bytes=0-3"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{\"live\":true}");
}

}  // namespace
}  // namespace libreyolo::server
