// LoadGenerator: generated protobuf/gRPC code only (no torch). The request is serialized once
// into a grpc::ByteBuffer and sent through the generic stub, so that the client does not pay a
// multi-megabyte serialization per call (a 640x640 FP32 image is 4.9 MB) and its own cost stays
// out of the measured server throughput.
#include "load.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "inference/grpc_predict_v2.grpc.pb.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#ifdef LIBREYOLO_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace libreyolo::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace pb = ::inference;

const char* const kMethod = "/inference.GRPCInferenceService/ModelInfer";

/// grpc::StatusCode -> its canonical name (the names grpcio and Triton print).
std::string code_name(grpc::StatusCode code) {
  static const char* const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c <= 16 ? names[c] : "CODE_" + std::to_string(c);
}

grpc::ByteBuffer serialize(const Target& target, const Payload& payload) {
  pb::ModelInferRequest req;
  req.set_model_name(target.model);
  req.set_model_version(target.version);
  auto* in = req.add_inputs();
  in->set_name(payload.input_name);
  in->set_datatype(payload.datatype);
  for (auto d : payload.shape) in->add_shape(d);
  for (const auto& [k, v] : payload.parameters) (*req.mutable_parameters())[k].set_double_param(v);
  if (payload.shm_region.empty()) {
    req.add_raw_input_contents(payload.raw);
  } else {
    auto& params = *in->mutable_parameters();
    params["shared_memory_region"].set_string_param(payload.shm_region);
    params["shared_memory_byte_size"].set_int64_param(
        static_cast<std::int64_t>(payload.raw.size()));
  }
  std::string wire;
  if (!req.SerializeToString(&wire)) throw std::runtime_error("cannot serialize ModelInferRequest");
  grpc::Slice slice(wire);
  return grpc::ByteBuffer(&slice, 1);
}

/// One call in flight; its address is the completion-queue tag.
struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  Clock::time_point start;
};

}  // namespace

struct LoadGenerator::Impl {
  Target target;
  std::int64_t images = 1;
  grpc::ByteBuffer request;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  grpc::CompletionQueue cq;
  std::thread poller;
  std::string probe;

  // The step in progress. Only the poller thread writes `result`; the rest is shared.
  std::mutex mu;
  std::condition_variable idle;
  std::atomic<int> in_flight{0};
  std::atomic<bool> issuing{false};
  std::atomic<std::uint64_t> sequence{0};
  bool closed_loop = false;
  Clock::time_point window_begin, window_end;
  StepResult result;

  void start_call() {
    auto* call = new Call;
    if (target.timeout_s > 0) {
      call->ctx.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::microseconds(static_cast<long long>(target.timeout_s * 1e6)));
    }
    auto& stub = *stubs[sequence++ % stubs.size()];
    in_flight++;
    call->start = Clock::now();
    call->reader = stub.PrepareUnaryCall(&call->ctx, kMethod, request, &cq);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
  }

  void poll() {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      const auto end = Clock::now();
      if (end >= window_begin && end < window_end) {
        if (call->status.ok()) {
          result.ok++;
          result.latency_ms.push_back(
              std::chrono::duration<double, std::milli>(end - call->start).count());
        } else {
          result.errors[code_name(call->status.error_code())]++;
          if (result.first_error.empty()) result.first_error = call->status.error_message();
        }
      }
      // Closed loop: every completion sends the next call until the window closes.
      if (closed_loop && issuing && Clock::now() < window_end) start_call();
      if (--in_flight == 0) {
        std::lock_guard<std::mutex> lock(mu);
        idle.notify_all();
      }
    }
  }
};

LoadGenerator::LoadGenerator(const Target& target, const Payload& payload, double connect_timeout_s)
    : impl_(std::make_unique<Impl>()) {
  impl_->target = target;
  impl_->images = payload.images;
  impl_->request = serialize(target, payload);
  const int limit = static_cast<int>(std::min<std::size_t>(target.max_message_bytes, INT32_MAX));
  for (int i = 0; i < std::max(1, target.channels); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(limit);
    args.SetMaxSendMessageSize(limit);
    // Without a local subchannel pool, channels with equal arguments share one connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto channel =
        grpc::CreateCustomChannel(target.server, grpc::InsecureChannelCredentials(), args);
    const auto deadline =
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<long long>(connect_timeout_s * 1e3));
    if (!channel->WaitForConnected(deadline)) {
      std::ostringstream os;
      os << "cannot connect to " << target.server << " within " << connect_timeout_s
         << " s (is libreyolo-server running there?)";
      throw std::runtime_error(os.str());
    }
    impl_->stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
    impl_->channels.push_back(std::move(channel));
  }

  // The probe: the same request, synchronously, through the typed stub.
  pb::ModelInferRequest req;
  {
    std::vector<grpc::Slice> slices;
    if (!impl_->request.Dump(&slices).ok()) throw std::runtime_error("cannot read the request");
    std::string wire;
    for (const auto& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    req.ParseFromString(wire);
  }
  auto stub = pb::GRPCInferenceService::NewStub(impl_->channels.front());
  grpc::ClientContext ctx;
  // At least 60 s: the probe checks the model and the input, not the deadline under test.
  if (target.timeout_s > 0) {
    const double seconds = std::max(target.timeout_s, 60.0);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<long long>(seconds * 1e6)));
  }
  pb::ModelInferResponse resp;
  const auto status = stub->ModelInfer(&ctx, req, &resp);
  if (!status.ok()) {
    throw std::runtime_error("probe ModelInfer on model '" + target.model + "' failed: " +
                             code_name(status.error_code()) + ": " + status.error_message());
  }
  std::ostringstream os;
  os << "ok: " << resp.outputs_size() << " outputs (";
  for (int i = 0; i < resp.outputs_size(); ++i) {
    const auto& o = resp.outputs(i);
    os << (i ? ", " : "") << o.name() << " " << o.datatype() << " [";
    for (int j = 0; j < o.shape_size(); ++j) os << (j ? "," : "") << o.shape(j);
    os << "]";
  }
  os << ") from model " << resp.model_name() << " version " << resp.model_version();
  impl_->probe = os.str();
  impl_->poller = std::thread([this] { impl_->poll(); });
}

LoadGenerator::~LoadGenerator() {
  impl_->cq.Shutdown();
  if (impl_->poller.joinable()) impl_->poller.join();
}

const std::string& LoadGenerator::probe_summary() const { return impl_->probe; }

StepResult LoadGenerator::run(const Step& step) {
  if ((step.concurrency > 0) == (step.rate > 0)) {
    throw std::invalid_argument("a step needs exactly one of concurrency > 0 or rate > 0");
  }
  auto& s = *impl_;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.idle.wait(lock, [&] { return s.in_flight.load() == 0; });
  }
  s.result = StepResult{};
  s.result.step = step;
  s.result.images_per_request = s.images;
  s.result.window_s = step.duration_s;
  const auto begin = Clock::now();
  s.window_begin = begin + std::chrono::microseconds(static_cast<long long>(step.warmup_s * 1e6));
  s.window_end =
      s.window_begin + std::chrono::microseconds(static_cast<long long>(step.duration_s * 1e6));
  s.closed_loop = step.concurrency > 0;
  s.issuing = true;
  if (s.closed_loop) {
    for (int i = 0; i < step.concurrency; ++i) s.start_call();
    std::this_thread::sleep_until(s.window_end);
  } else {
    std::mt19937_64 rng(step.seed);
    std::exponential_distribution<double> gap(step.rate);
    auto next = begin;
    std::uint64_t dropped = 0;
    while (true) {
      next += std::chrono::nanoseconds(static_cast<long long>(gap(rng) * 1e9));
      if (next >= s.window_end) break;
      std::this_thread::sleep_until(next);
      if (s.in_flight.load() >= step.max_outstanding) {
        if (next >= s.window_begin) dropped++;
        continue;
      }
      s.start_call();
    }
    s.result.dropped = dropped;
    std::this_thread::sleep_until(s.window_end);
  }
  s.issuing = false;
  std::unique_lock<std::mutex> lock(s.mu);
  s.idle.wait(lock, [&] { return s.in_flight.load() == 0; });
  return std::move(s.result);
}

namespace {

std::unique_ptr<pb::GRPCInferenceService::Stub> control_stub(const Target& target) {
  return pb::GRPCInferenceService::NewStub(
      grpc::CreateChannel(target.server, grpc::InsecureChannelCredentials()));
}

void check(const grpc::Status& status, const std::string& what) {
  if (!status.ok()) {
    throw std::runtime_error(what + ": " + code_name(status.error_code()) + " " +
                             status.error_message());
  }
}

grpc::ClientContext* with_deadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return &ctx;
}

}  // namespace

SharedInput::SharedInput(const Target& target, const std::string& kind, const std::string& bytes)
    : target_(target), kind_(kind), bytes_(bytes.size()) {
  region_ = "libreyolo_bench_" + std::to_string(::getpid());
  auto stub = control_stub(target);
  grpc::ClientContext ctx;
  if (kind == "system") {
    key_ = "/" + region_;
    ::shm_unlink(key_.c_str());
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("cannot create shared memory " + key_ + ": " + std::strerror(errno));
    }
    host_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (host_ == MAP_FAILED) {
      host_ = nullptr;
      throw std::runtime_error("cannot map " + key_);
    }
    std::memcpy(host_, bytes.data(), bytes_);
    pb::SystemSharedMemoryRegisterRequest req;
    req.set_name(region_);
    req.set_key(key_);
    req.set_byte_size(bytes_);
    pb::SystemSharedMemoryRegisterResponse resp;
    check(stub->SystemSharedMemoryRegister(with_deadline(ctx), req, &resp),
          "SystemSharedMemoryRegister");
  } else if (kind == "cuda") {
#ifdef LIBREYOLO_BENCH_CUDA
    if (cudaMalloc(&device_, bytes_) != cudaSuccess ||
        cudaMemcpy(device_, bytes.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cannot allocate the CUDA input");
    }
    cudaIpcMemHandle_t handle;
    if (cudaIpcGetMemHandle(&handle, device_) != cudaSuccess)
      throw std::runtime_error("cudaIpcGetMemHandle failed");
    pb::CudaSharedMemoryRegisterRequest req;
    req.set_name(region_);
    req.set_raw_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    req.set_device_id(0);
    req.set_byte_size(bytes_);
    pb::CudaSharedMemoryRegisterResponse resp;
    check(stub->CudaSharedMemoryRegister(with_deadline(ctx), req, &resp),
          "CudaSharedMemoryRegister");
#else
    throw std::runtime_error("--shm cuda: libreyolo-bench was built without CUDA");
#endif
  } else {
    throw std::invalid_argument("--shm must be system or cuda, got '" + kind + "'");
  }
}

SharedInput::~SharedInput() {
  auto stub = control_stub(target_);
  grpc::ClientContext ctx;
  if (kind_ == "system") {
    pb::SystemSharedMemoryUnregisterRequest req;
    req.set_name(region_);
    pb::SystemSharedMemoryUnregisterResponse resp;
    (void)stub->SystemSharedMemoryUnregister(with_deadline(ctx), req, &resp);
    if (host_) ::munmap(host_, bytes_);
    ::shm_unlink(key_.c_str());
  } else {
    pb::CudaSharedMemoryUnregisterRequest req;
    req.set_name(region_);
    pb::CudaSharedMemoryUnregisterResponse resp;
    (void)stub->CudaSharedMemoryUnregister(with_deadline(ctx), req, &resp);
#ifdef LIBREYOLO_BENCH_CUDA
    if (device_) cudaFree(device_);
#endif
  }
}

}  // namespace libreyolo::bench
