// libFuzzer target: the OIP request path of ModelInfer. The input is a serialised
// inference.ModelInferRequest (protobuf bytes, what gRPC hands the service after its own
// message-size limit), parsed by protobuf, converted by the transport's to_infer_request
// (server/grpc/infer_request.cpp, exactly what GrpcServer's ModelInfer calls) and served by a
// real ServerCore (public API only: constructor, load_repository, infer) over a repository with a
// fake detector, a fake segmenter and a fake classifier (tests/fuzz/torch_support.h): inputs, raw
// and typed contents, parameters, shapes, datatypes, image decoding and preprocessing, batching and
// the post-processing of the fakes' outputs. api::Error is an expected answer except INTERNAL (bad
// client input must be INVALID_ARGUMENT, NOT_FOUND, ...: DESIGN.md "Errors"); a response whose
// output bytes disagree with its shapes, any other exception, a crash or a sanitizer report is a
// bug. Seed corpus: tests/fuzz/corpus/oip_request/ (tests/fuzz/make_seeds.py: valid
// requests for both models and the hostile tests' attacks).
//
// This translation unit sees Debian's protobuf and never torch (DESIGN.md "Header traps").
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "inference/grpc_predict_v2.pb.h"
#include "server/config/config.h"
#include "server/core/core.h"
#include "server/grpc/infer_request.h"
#include "server/metrics/metrics.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/torch_support.h"

extern "C" const char* __asan_default_options() {
  // The core's batcher and pool threads hold their allocations across executions.
  return "detect_leaks=0";
}

namespace {

using namespace libreyolo::server;
using libreyolo::fuzz::fail;

ServerCore& core() {
  static Metrics metrics;
  static ServerConfig config = [] {
    ServerConfig c = parse_config("", "fuzz.yaml", {}, {{"LIBREYOLO_HUB_KERNELS", "0"}});
    c.model_repository.value = libreyolo::fuzz::write_fake_repository();
    c.device.value = "cpu";
    c.preprocess_threads.value = 2;
    // 4 Mpx instead of the default 40 Mpx: the same checks, shorter executions.
    c.max_pixels_per_image.value = int64_t{1} << 22;
    return c;
  }();
  static ServerCore* core = [] {
    auto* s = new ServerCore(config, metrics, libreyolo::fuzz::fake_models());
    if (s->load_repository() != 3) fail("the fake repository did not load");
    return s;
  }();
  return *core;
}

size_t itemsize(const std::string& datatype) {
  if (datatype == "FP32" || datatype == "INT32" || datatype == "UINT32") return 4;
  if (datatype == "INT64" || datatype == "UINT64" || datatype == "FP64") return 8;
  if (datatype == "INT16" || datatype == "UINT16" || datatype == "FP16" || datatype == "BF16")
    return 2;
  if (datatype == "INT8" || datatype == "UINT8" || datatype == "BOOL") return 1;
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every invalid UTF-8 string it parses; the answer is what is checked.
  google::protobuf::SetLogHandler(nullptr);
  (void)core();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace api = libreyolo::server::api;
  inference::ModelInferRequest message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC's answer
  api::InferRequest request;
  // No region is registered: a request naming one is NOT_FOUND, as ModelInfer answers it.
  static const libreyolo::server::shm::Registry registry;
  libreyolo::server::rpc::CallRegions regions;
  try {
    request = libreyolo::server::rpc::to_infer_request(message, registry, regions);
  } catch (const api::Error& e) {
    if (e.code() != api::Code::invalid_argument && e.code() != api::Code::not_found)
      fail(std::string("conversion: ") + e.what());
    return 0;
  }
  try {
    const api::InferResponse response = core().infer(std::move(request));
    for (const auto& out : response.outputs) {
      int64_t n = 1;
      for (int64_t d : out.shape) {
        if (d < 0) fail("output '" + out.name + "' has a negative dimension");
        n *= d;
      }
      const size_t item = itemsize(out.datatype);
      if (item != 0 && out.data.size() != static_cast<size_t>(n) * item)
        fail("output '" + out.name + "': " + std::to_string(out.data.size()) +
             " bytes for its shape");
    }
  } catch (const api::Error& e) {
    if (e.code() == api::Code::internal) fail(std::string("INTERNAL: ") + e.what());
  }
  return 0;
}
