// libreyolo-bench: load generator for libreyolo-server (inference.GRPCInferenceService/ModelInfer).
//
//   libreyolo-bench [--server HOST:PORT] [--model NAME] [--model-version V]
//                   (--image FILE | --shape [N,]3,H,W) [--batch N] [--threshold T]
//                   [--concurrency 1,2,4,...,64 | --rate R[,R...]] [--duration S] [--warmup S]
//                   [--timeout S] [--channels N] [--seed N] [--csv FILE] [--json FILE]
//                   [--shm system|cuda]
//
// --image sends the encoded file as BYTES input `images` ([batch] copies); --shape sends uniform
// random FP32 `pixel_values` [batch,3,H,W]. Each step runs --warmup seconds unrecorded, then
// --duration seconds recorded: throughput counts OK responses completed inside that window
// (inferences/s = responses * batch / duration), latency is send -> response of those calls, and
// errors are counted by gRPC status code. --concurrency keeps N calls in flight (closed loop);
// --rate sends Poisson arrivals at R requests/s (open loop). --shm system|cuda puts the input
// into a POSIX / CUDA (device 0) shared-memory region registered once with the server; every
// call then names the region instead of carrying the bytes. Defaults: --concurrency
// 1,2,4,8,16,32,64, --duration 10, --warmup 2, --server localhost:8001, --model rtdetr_tiny.
// Exit codes: 0 every step ran (errors, if any, are in the report), 1 could not run (connection,
// probe request, files), 2 usage error.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <memory>

#include "load.h"
#include "report.h"
#include "server/grpc/client.h"

namespace {

using namespace libreyolo::bench;

int usage(const std::string& why = "") {
  if (!why.empty()) std::cerr << "libreyolo-bench: " << why << "\n";
  std::cerr
      << "usage: libreyolo-bench [--server HOST:PORT] [--model NAME] [--model-version V]\n"
         "                       (--image FILE | --shape [N,]3,H,W) [--batch N] [--threshold T]\n"
         "                       [--concurrency 1,2,4,...,64 | --rate R[,R...]] [--duration S]\n"
         "                       [--warmup S] [--timeout S] [--channels N] [--seed N]\n"
         "                       [--csv FILE] [--json FILE] [--shm system|cuda]\n";
  return 2;
}

std::vector<double> numbers(const std::string& list, const std::string& flag) {
  std::vector<double> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    const double v = std::stod(item, &used);
    if (used != item.size() || !(v > 0))
      throw std::invalid_argument(flag + ": bad value '" + item + "'");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument(flag + " needs a value");
  return out;
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string out;
  for (auto d : v) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Target target;
  std::string image, shape_text, csv_path, json_path, concurrency_text, rate_text, shm_kind;
  std::int64_t batch = 0;
  double duration = 10, warmup = 2;
  double threshold = -1;
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    try {
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--server")
        target.server = value();
      else if (a == "--model")
        target.model = value();
      else if (a == "--model-version")
        target.version = value();
      else if (a == "--image")
        image = value();
      else if (a == "--shape")
        shape_text = value();
      else if (a == "--batch")
        batch = std::stoll(value());
      else if (a == "--threshold")
        threshold = std::stod(value());
      else if (a == "--concurrency")
        concurrency_text = value();
      else if (a == "--rate")
        rate_text = value();
      else if (a == "--duration")
        duration = std::stod(value());
      else if (a == "--warmup")
        warmup = std::stod(value());
      else if (a == "--timeout")
        target.timeout_s = std::stod(value());
      else if (a == "--channels")
        target.channels = std::stoi(value());
      else if (a == "--seed")
        seed = std::stoull(value());
      else if (a == "--csv")
        csv_path = value();
      else if (a == "--shm")
        shm_kind = value();
      else if (a == "--json")
        json_path = value();
      else if (a == "-h" || a == "--help")
        return usage();
      else
        return usage("unknown argument '" + a + "'");
    } catch (const std::exception& e) {
      return usage(e.what());
    }
  }
  if (image.empty() == shape_text.empty()) return usage("give exactly one of --image or --shape");
  if (!concurrency_text.empty() && !rate_text.empty())
    return usage("--concurrency and --rate are exclusive");
  if (duration <= 0 || warmup < 0) return usage("--duration must be > 0 and --warmup >= 0");
  if (batch < 0 || target.channels < 1) return usage("--batch and --channels must be positive");

  std::vector<Step> steps;
  try {
    if (rate_text.empty()) {
      for (double c : numbers(concurrency_text.empty() ? "1,2,4,8,16,32,64" : concurrency_text,
                              "--concurrency")) {
        Step s;
        s.concurrency = static_cast<int>(c);
        steps.push_back(s);
      }
    } else {
      for (double r : numbers(rate_text, "--rate")) {
        Step s;
        s.rate = r;
        steps.push_back(s);
      }
    }
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  for (auto& s : steps) {
    s.duration_s = duration;
    s.warmup_s = warmup;
    s.seed = seed;
  }

  Payload payload;
  std::map<std::string, std::string> run{{"server", target.server}, {"model", target.model}};
  if (!image.empty()) {
    std::ifstream in(image, std::ios::binary);
    if (!in) {
      std::cerr << "libreyolo-bench: cannot read --image " << image << "\n";
      return 1;
    }
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    payload.images = batch > 0 ? batch : 1;
    payload.input_name = "images";
    payload.datatype = "BYTES";
    payload.shape = {payload.images};
    payload.raw = libreyolo::server::rpc::pack_bytes(
        std::vector<std::string>(static_cast<std::size_t>(payload.images), bytes));
    run["input"] = "images BYTES [" + join(payload.shape) + "] from " + image + " (" +
                   std::to_string(bytes.size()) + " bytes each)";
  } else {
    std::vector<std::int64_t> dims;
    try {
      for (double d : numbers(shape_text, "--shape")) dims.push_back(static_cast<std::int64_t>(d));
    } catch (const std::exception& e) {
      return usage(e.what());
    }
    if (dims.size() == 3) dims.insert(dims.begin(), batch > 0 ? batch : 1);
    if (dims.size() != 4 || dims[1] != 3) return usage("--shape is [N,]3,H,W");
    if (batch > 0 && dims[0] != batch) return usage("--shape N and --batch disagree");
    payload.images = dims[0];
    payload.input_name = "pixel_values";
    payload.datatype = "FP32";
    payload.shape = dims;
    std::vector<float> pixels(static_cast<std::size_t>(dims[0] * dims[1] * dims[2] * dims[3]));
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_real_distribution<float> uniform(0.f, 1.f);
    for (auto& p : pixels) p = uniform(rng);
    payload.raw.assign(reinterpret_cast<const char*>(pixels.data()), pixels.size() * sizeof(float));
    run["input"] = "pixel_values FP32 [" + join(dims) + "] uniform random";
  }
  if (threshold >= 0) payload.parameters["threshold"] = threshold;
  run["duration_s"] = std::to_string(duration);
  run["warmup_s"] = std::to_string(warmup);
  run["channels"] = std::to_string(target.channels);
  run["timeout_s"] = std::to_string(target.timeout_s);

  if (!shm_kind.empty()) run["shm"] = shm_kind;

  std::vector<Summary> rows;
  try {
    // --shm: the input goes into a registered region once; every call names it instead of
    // carrying the bytes (Triton's shared-memory extensions, server/shm/registry.h).
    std::unique_ptr<SharedInput> shared;
    if (!shm_kind.empty()) {
      shared = std::make_unique<SharedInput>(target, shm_kind, payload.raw);
      payload.shm_region = shared->region();
      run["input"] += " in " + shm_kind + " shared memory region " + shared->region();
    }
    LoadGenerator generator(target, payload);
    std::cerr << "libreyolo-bench: " << target.server << " model " << target.model << ", "
              << run["input"] << "; probe " << generator.probe_summary() << "\n";
    run["probe"] = generator.probe_summary();
    for (const auto& step : steps) {
      rows.push_back(summarize(generator.run(step)));
      const auto& r = rows.back();
      std::cerr << "libreyolo-bench: " << r.mode << " " << r.load << ": " << r.inferences_per_s
                << " infer/s, p50 " << r.p50_ms << " ms, p99 " << r.p99_ms << " ms, " << r.ok
                << " ok, " << r.errors << " errors\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-bench: " << e.what() << "\n";
    return 1;
  }
  print_table(std::cout, rows);
  if (!csv_path.empty()) {
    std::ofstream out(csv_path);
    write_csv(out, rows);
    if (!out) {
      std::cerr << "libreyolo-bench: cannot write " << csv_path << "\n";
      return 1;
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    write_json(out, run, rows);
    if (!out) {
      std::cerr << "libreyolo-bench: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}
