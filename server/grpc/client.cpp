// Client implementation: generated stubs + text format. Sees gRPC/protobuf, never torch.
#include "server/grpc/client.h"

#include <google/protobuf/text_format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <stdexcept>

#include "grpc/health/v1/health.grpc.pb.h"
#include "inference/grpc_predict_v2.grpc.pb.h"

namespace libreyolo::server::rpc {
namespace {

namespace pb = ::inference;

void set_deadline(grpc::ClientContext& ctx, double seconds) {
  if (seconds > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<long long>(seconds * 1e6)));
  }
}

void parse(const std::string& text, google::protobuf::Message* msg) {
  if (!google::protobuf::TextFormat::ParseFromString(text, msg)) {
    throw std::invalid_argument("cannot parse " + msg->GetTypeName() + " text: " + text);
  }
}

template <class T, class Field>
void append_as(std::string& out, const Field& values) {
  for (const auto& v : values) {
    const T t = static_cast<T>(v);
    out.append(reinterpret_cast<const char*>(&t), sizeof(T));
  }
}

/// Typed output contents -> raw layout.
std::string pack(const std::string& dt, const pb::InferTensorContents& c) {
  std::string out;
  if (dt == "FP32")
    append_as<float>(out, c.fp32_contents());
  else if (dt == "FP64")
    append_as<double>(out, c.fp64_contents());
  else if (dt == "INT64")
    append_as<std::int64_t>(out, c.int64_contents());
  else if (dt == "INT32")
    append_as<std::int32_t>(out, c.int_contents());
  else if (dt == "UINT8")
    append_as<std::uint8_t>(out, c.uint_contents());
  else if (dt == "BOOL")
    append_as<std::uint8_t>(out, c.bool_contents());
  else if (dt == "BYTES") {
    out =
        pack_bytes(std::vector<std::string>(c.bytes_contents().begin(), c.bytes_contents().end()));
  }
  return out;
}

/// ModelInfer's answer as an InferResult (outputs in raw layout).
InferResult to_result(const grpc::Status& status, const pb::ModelInferResponse& resp) {
  InferResult result;
  result.code = static_cast<api::Code>(status.error_code());
  result.message = status.error_message();
  if (!status.ok()) return result;
  result.model_name = resp.model_name();
  result.model_version = resp.model_version();
  result.id = resp.id();
  for (int i = 0; i < resp.outputs_size(); ++i) {
    const auto& o = resp.outputs(i);
    api::OutputTensor t;
    t.name = o.name();
    t.datatype = o.datatype();
    t.shape.assign(o.shape().begin(), o.shape().end());
    t.data = i < resp.raw_output_contents_size() ? resp.raw_output_contents(i)
                                                 : pack(o.datatype(), o.contents());
    for (const auto& [k, v] : o.parameters()) {
      switch (v.parameter_choice_case()) {
        case pb::InferParameter::kBoolParam:
          t.parameters[k] = v.bool_param();
          break;
        case pb::InferParameter::kInt64Param:
          t.parameters[k] = v.int64_param();
          break;
        case pb::InferParameter::kDoubleParam:
          t.parameters[k] = v.double_param();
          break;
        case pb::InferParameter::kUint64Param:
          t.parameters[k] = v.uint64_param();
          break;
        default:
          t.parameters[k] = v.string_param();
      }
    }
    result.outputs.push_back(std::move(t));
  }
  return result;
}

pb::ModelInferRequest infer_request(const std::string& request_text,
                                    const std::vector<std::string>& raw_inputs) {
  pb::ModelInferRequest req;
  parse(request_text, &req);
  for (const auto& r : raw_inputs) req.add_raw_input_contents(r);
  return req;
}

}  // namespace

const api::OutputTensor& InferResult::output(const std::string& name) const {
  for (const auto& o : outputs) {
    if (o.name == name) return o;
  }
  throw std::out_of_range("no output '" + name + "' in the response");
}

struct Client::Impl {
  std::vector<std::pair<std::string, std::string>> metadata;
  /// The call's deadline and the metadata of add_metadata().
  void prepare(grpc::ClientContext& ctx, double seconds) const {
    set_deadline(ctx, seconds);
    for (const auto& [k, v] : metadata) ctx.AddMetadata(k, v);
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::GRPCInferenceService::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

Client::Client(const std::string& address, std::size_t max_message_bytes,
               const std::optional<ClientTls>& tls)
    : impl_(std::make_unique<Impl>()) {
  grpc::ChannelArguments args;
  const int limit = static_cast<int>(std::min<std::size_t>(max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  // Reconnect quickly to a daemon that is still starting (gRPC's default backoff grows to 120 s).
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC core takes it as the minimum connect timeout
  // (doc/connection-backoff.md MIN_CONNECT_TIMEOUT, 20 s by default), and at 100 ms a busy host's
  // handshake ("timed out before receiving SETTINGS frame") failed calls at once with UNAVAILABLE
  // (60 concurrent clients on 2 cores: 40 of 60).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = tls->root_certificates;
    o.pem_private_key = tls->private_key;
    o.pem_cert_chain = tls->certificate_chain;
    credentials = grpc::SslCredentials(o);
    if (!tls->server_name.empty()) args.SetSslTargetNameOverride(tls->server_name);
  }
  impl_->channel = grpc::CreateCustomChannel(address, credentials, args);
  impl_->stub = pb::GRPCInferenceService::NewStub(impl_->channel);
  impl_->health = grpc::health::v1::Health::NewStub(impl_->channel);
}

Client::~Client() = default;

void Client::add_metadata(const std::string& key, const std::string& value) {
  impl_->metadata.emplace_back(key, value);
}

CallResult Client::call(const std::string& method, const std::string& request_text,
                        double timeout_seconds) {
  CallResult result;
  grpc::ClientContext ctx;
  impl_->prepare(ctx, timeout_seconds);
  grpc::Status status;
  bool known = false;
#define LIBREYOLO_UNARY(M)                                                            \
  if (method == #M) {                                                                 \
    known = true;                                                                     \
    pb::M##Request req;                                                               \
    parse(request_text, &req);                                                        \
    pb::M##Response resp;                                                             \
    status = impl_->stub->M(&ctx, req, &resp);                                        \
    if (status.ok()) google::protobuf::TextFormat::PrintToString(resp, &result.text); \
  }
  LIBREYOLO_UNARY(ServerLive)
  LIBREYOLO_UNARY(ServerReady)
  LIBREYOLO_UNARY(ModelReady)
  LIBREYOLO_UNARY(ServerMetadata)
  LIBREYOLO_UNARY(ModelMetadata)
  LIBREYOLO_UNARY(ModelConfig)
  LIBREYOLO_UNARY(ModelStatistics)
  LIBREYOLO_UNARY(RepositoryIndex)
  LIBREYOLO_UNARY(RepositoryModelLoad)
  LIBREYOLO_UNARY(RepositoryModelUnload)
  LIBREYOLO_UNARY(ModelInfer)
  LIBREYOLO_UNARY(SystemSharedMemoryStatus)
  LIBREYOLO_UNARY(SystemSharedMemoryRegister)
  LIBREYOLO_UNARY(SystemSharedMemoryUnregister)
  LIBREYOLO_UNARY(CudaSharedMemoryStatus)
  LIBREYOLO_UNARY(CudaSharedMemoryRegister)
  LIBREYOLO_UNARY(CudaSharedMemoryUnregister)
#undef LIBREYOLO_UNARY
  if (!known) throw std::invalid_argument("unknown GRPCInferenceService method '" + method + "'");
  result.code = static_cast<api::Code>(status.error_code());
  result.message = status.error_message();
  return result;
}

CallResult Client::call_raw(const std::string& method, const std::string& request_bytes,
                            double timeout_seconds) {
  CallResult result;
  grpc::ClientContext ctx;
  impl_->prepare(ctx, timeout_seconds);
  grpc::Slice slice(request_bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(impl_->channel);
  auto call =
      stub.PrepareUnaryCall(&ctx, "/inference.GRPCInferenceService/" + method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, &result);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);  // Finish always delivers its tag
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  result.code = static_cast<api::Code>(status.error_code());
  result.message = status.error_message();
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    if (response.Valid() && response.Dump(&slices).ok()) {
      for (const auto& s : slices)
        result.text.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return result;
}

CallResult Client::health(const std::string& service, double timeout_seconds) {
  CallResult result;
  grpc::ClientContext ctx;
  impl_->prepare(ctx, timeout_seconds);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const auto status = impl_->health->Check(&ctx, req, &resp);
  result.code = static_cast<api::Code>(status.error_code());
  result.message = status.error_message();
  if (status.ok())
    result.text = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  return result;
}

CallResult Client::watch_health(const std::string& service, double timeout_seconds,
                                const std::function<void()>& on_message) {
  CallResult result;
  grpc::ClientContext ctx;
  impl_->prepare(ctx, timeout_seconds);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  auto reader = impl_->health->Watch(&ctx, req);
  grpc::health::v1::HealthCheckResponse resp;
  while (reader->Read(&resp)) {
    if (!result.text.empty()) result.text += " ";
    result.text += grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
    if (on_message) on_message();
  }
  const auto status = reader->Finish();
  result.code = static_cast<api::Code>(status.error_code());
  result.message = status.error_message();
  return result;
}

InferResult Client::infer(const std::string& request_text,
                          const std::vector<std::string>& raw_inputs, double timeout_seconds) {
  const auto req = infer_request(request_text, raw_inputs);
  grpc::ClientContext ctx;
  impl_->prepare(ctx, timeout_seconds);
  pb::ModelInferResponse resp;
  const auto status = impl_->stub->ModelInfer(&ctx, req, &resp);
  return to_result(status, resp);
}

// One call on its own completion queue: wait() takes its single event.
struct PendingInfer::Impl {
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  pb::ModelInferResponse resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ModelInferResponse>> reader;
  bool done = false;
  InferResult result;
};

PendingInfer::PendingInfer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PendingInfer::~PendingInfer() {
  if (!impl_->done) {
    impl_->ctx.TryCancel();
    wait();
  }
}

void PendingInfer::cancel() { impl_->ctx.TryCancel(); }

InferResult PendingInfer::wait() {
  if (!impl_->done) {
    void* tag = nullptr;
    bool ok = false;
    impl_->cq.Next(&tag, &ok);  // Finish always delivers its tag, ok or not
    impl_->cq.Shutdown();
    while (impl_->cq.Next(&tag, &ok)) {
    }
    impl_->done = true;
    impl_->result = to_result(impl_->status, impl_->resp);
  }
  return impl_->result;
}

std::unique_ptr<PendingInfer> Client::start_infer(const std::string& request_text,
                                                  const std::vector<std::string>& raw_inputs,
                                                  double timeout_seconds) {
  const auto req = infer_request(request_text, raw_inputs);
  auto impl = std::make_unique<PendingInfer::Impl>();
  impl_->prepare(impl->ctx, timeout_seconds);
  impl->reader = impl_->stub->AsyncModelInfer(&impl->ctx, req, &impl->cq);
  impl->reader->Finish(&impl->resp, &impl->status, impl.get());
  return std::unique_ptr<PendingInfer>(new PendingInfer(std::move(impl)));
}

std::vector<InferResult> Client::infer_concurrently(const std::string& request_text,
                                                    const std::vector<std::string>& raw_inputs,
                                                    int count, double timeout_seconds) {
  struct Call {
    grpc::ClientContext ctx;
    pb::ModelInferResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ModelInferResponse>> reader;
  };
  const auto req = infer_request(request_text, raw_inputs);
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < count; ++i) {
    calls.push_back(std::make_unique<Call>());
    auto& c = *calls.back();
    impl_->prepare(c.ctx, timeout_seconds);
    c.reader = impl_->stub->AsyncModelInfer(&c.ctx, req, &cq);
    c.reader->Finish(&c.resp, &c.status, reinterpret_cast<void*>(static_cast<std::intptr_t>(i)));
  }
  for (int done = 0; done < count; ++done) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<InferResult> out;
  out.reserve(calls.size());
  for (const auto& c : calls) out.push_back(to_result(c->status, c->resp));
  return out;
}

std::string pack_bytes(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) {
    const auto n = static_cast<std::uint32_t>(e.size());
    char len[4];
    std::memcpy(len, &n, 4);
    out.append(len, 4);
    out.append(e);
  }
  return out;
}

std::vector<std::string> unpack_bytes(const std::string& raw) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at + 4 <= raw.size()) {
    std::uint32_t n = 0;
    std::memcpy(&n, raw.data() + at, 4);
    at += 4;
    out.push_back(raw.substr(at, n));
    at += n;
  }
  return out;
}

std::string text_escape(const std::string& bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace libreyolo::server::rpc
