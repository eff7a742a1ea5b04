// A small synchronous client of the daemon, for the command-line client and the integration
// tests. Requests are written in protobuf text format (field names of grpc_predict_v2.proto) so
// that callers never include generated code, which cannot share a translation unit with torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/api/types.h"

namespace libreyolo::server::rpc {

/// Outcome of one unary call. `code` is the gRPC status code; `text` the response message in
/// protobuf text format (empty unless ok).
struct CallResult {
  api::Code code = api::Code::unknown;
  std::string message;
  std::string text;
  bool ok() const { return code == api::Code::ok; }
};

/// Outcome of ModelInfer, with every output in raw layout (typed outputs are packed).
struct InferResult {
  api::Code code = api::Code::unknown;
  std::string message;
  std::string model_name, model_version, id;
  std::vector<api::OutputTensor> outputs;
  bool ok() const { return code == api::Code::ok; }
  /// The output named `name`; throws std::out_of_range when absent.
  const api::OutputTensor& output(const std::string& name) const;
};

/// A ModelInfer in flight (Client::start_infer); the Client must outlive it. Not thread-safe
/// except cancel(), which any thread may call while another waits.
class PendingInfer {
 public:
  /// Cancels the call when it is still unanswered, then waits for its end.
  ~PendingInfer();
  PendingInfer(const PendingInfer&) = delete;
  PendingInfer& operator=(const PendingInfer&) = delete;

  /// grpc::ClientContext::TryCancel: the call ends CANCELLED unless the answer already arrived;
  /// the server sees the cancellation (ServerContext::IsCancelled).
  void cancel();
  /// Blocks until the answer (or the call's end); the first call returns the result, later
  /// calls the same result again.
  InferResult wait();

 private:
  friend class Client;
  struct Impl;
  explicit PendingInfer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// TLS for a Client of a daemon with server.tls: PEM contents, not paths.
struct ClientTls {
  std::string root_certificates;  ///< the CA that signed the server's certificate
  std::string private_key;        ///< the client's key, for mutual TLS ("": none)
  std::string certificate_chain;  ///< the client's certificate, for mutual TLS
  /// The name checked against the server's certificate ("": the host of the address).
  std::string server_name;
};

class Client {
 public:
  /// `address` host:port; `tls` set: TLS (else plain text). Channels are created lazily by
  /// gRPC; nothing is sent here.
  explicit Client(const std::string& address, std::size_t max_message_bytes = 64u << 20,
                  const std::optional<ClientTls>& tls = std::nullopt);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Calls GRPCInferenceService/<method> ("ServerLive", "ModelMetadata", "ModelConfig", ...) with
  /// `request_text` parsed as its request message. Throws std::invalid_argument for an unknown
  /// method or unparsable text.
  CallResult call(const std::string& method, const std::string& request_text = "",
                  double timeout_seconds = 10.0);

  /// Calls GRPCInferenceService/<method> with `request_bytes` sent as they are, unparsed
  /// (grpc::GenericStub): how a hostile or broken peer's bytes reach the server. `text` is the
  /// response's serialized bytes when ok. Any method name is sent; the server answers.
  CallResult call_raw(const std::string& method, const std::string& request_bytes,
                      double timeout_seconds = 10.0);

  /// Sends `key: value` (lower-case key) as metadata with every later call, e.g. the header a
  /// server.restricted_apis group expects. Not thread-safe with calls in flight.
  void add_metadata(const std::string& key, const std::string& value);

  /// grpc.health.v1.Health/Check: text is "SERVING", "NOT_SERVING", ... when ok.
  CallResult health(const std::string& service, double timeout_seconds = 5.0);

  /// grpc.health.v1.Health/Watch, read until the server ends the stream or `timeout_seconds`
  /// pass (then DEADLINE_EXCEEDED): `text` is every status received, space-separated
  /// ("SERVING NOT_SERVING"); `on_message` (optional) runs after each one.
  CallResult watch_health(const std::string& service, double timeout_seconds,
                          const std::function<void()>& on_message = {});

  /// ModelInfer: `request_text` is a ModelInferRequest in text format; each of `raw_inputs` is
  /// appended to raw_input_contents (binary data needs no escaping this way).
  /// `timeout_seconds` <= 0: no deadline.
  InferResult infer(const std::string& request_text,
                    const std::vector<std::string>& raw_inputs = {}, double timeout_seconds = 30.0);

  /// ModelInfer (arguments as infer()) sent at once, without waiting: the answer comes from
  /// PendingInfer::wait(); PendingInfer::cancel() cancels it. Throws std::invalid_argument for
  /// unparsable text.
  std::unique_ptr<PendingInfer> start_infer(const std::string& request_text,
                                            const std::vector<std::string>& raw_inputs = {},
                                            double timeout_seconds = 30.0);

  /// Sends `count` copies of one ModelInfer concurrently (gRPC's async API on one completion
  /// queue: every call is on the wire before the first answer is read) and returns the answers
  /// in sending order. Throws std::invalid_argument for unparsable text.
  std::vector<InferResult> infer_concurrently(const std::string& request_text,
                                              const std::vector<std::string>& raw_inputs, int count,
                                              double timeout_seconds = 30.0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Packs elements into the OIP BYTES layout (4-byte little-endian length before each).
std::string pack_bytes(const std::vector<std::string>& elements);

/// The elements of an OIP BYTES tensor's raw data (pack_bytes' inverse, e.g. the `labels` of a
/// prompted detector). A truncated last length prefix ends the list; a length past the data
/// keeps what is there.
std::vector<std::string> unpack_bytes(const std::string& raw);

/// Escapes `bytes` for a protobuf text-format string literal ("..." contents).
std::string text_escape(const std::string& bytes);

}  // namespace libreyolo::server::rpc
