// libreyolo-client: talks to libreyolo-server over gRPC (inference.GRPCInferenceService).
//   libreyolo-client detect --image FILE [--image FILE ...] [--server HOST:PORT] [--model NAME]
//                           [--threshold T] [--timeout SECONDS]
//   libreyolo-client health [--server HOST:PORT] [--service NAME]
//   libreyolo-client call METHOD [TEXT] [--server HOST:PORT]   (e.g. call ModelConfig 'name: "m"')
// Exit status: 0 on success, 1 on a gRPC error (its code and message on stderr), 2 on usage errors.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "server/rpc/client.h"

namespace {

using namespace libreyolo::server;

int usage() {
  std::cerr << "usage: libreyolo-client detect --image FILE [--image FILE ...] [--server "
               "HOST:PORT] [--model NAME]\n"
               "                              [--threshold T] [--timeout SECONDS]\n"
               "       libreyolo-client health [--server HOST:PORT] [--service NAME]\n"
               "       libreyolo-client call METHOD [REQUEST_TEXT] [--server HOST:PORT]\n"
               "defaults: --server localhost:8001 --model rtdetr_tiny\n";
  return 2;
}

template <class T>
std::vector<T> as(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
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

int fail(api::Code code, const std::string& message) {
  std::cerr << "error: " << api::code_name(code) << ": " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string command = argv[1];
  std::string server = "localhost:8001", model = "rtdetr_tiny", service;
  std::vector<std::string> images, positional;
  double threshold = -1, timeout = 30;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--server")
        server = value();
      else if (a == "--model")
        model = value();
      else if (a == "--image")
        images.push_back(value());
      else if (a == "--threshold")
        threshold = std::stod(value());
      else if (a == "--timeout")
        timeout = std::stod(value());
      else if (a == "--service")
        service = value();
      else if (a.rfind("--", 0) == 0)
        return usage();
      else
        positional.push_back(a);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return usage();
    }
  }
  rpc::Client client(server);
  if (command == "health") {
    auto r = client.health(service);
    if (!r.ok()) return fail(r.code, r.message);
    std::cout << r.text << "\n";
    return r.text == "SERVING" ? 0 : 1;
  }
  if (command == "call") {
    if (positional.empty()) return usage();
    try {
      auto r = client.call(positional[0], positional.size() > 1 ? positional[1] : "", timeout);
      if (!r.ok()) return fail(r.code, r.message);
      std::cout << r.text;
      return 0;
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  if (command != "detect" || images.empty()) return usage();
  std::vector<std::string> data;
  for (const auto& path : images) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "cannot read " << path << "\n";
      return 2;
    }
    data.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ostringstream text;
  text << "model_name: \"" << rpc::text_escape(model)
       << "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " << data.size() << " }";
  if (threshold >= 0)
    text << " parameters { key: \"threshold\" value { double_param: " << threshold << " } }";
  auto r = client.infer(text.str(), {rpc::pack_bytes(data)}, timeout);
  if (!r.ok()) return fail(r.code, r.message);
  const auto counts = as<std::int32_t>(r.output("num_detections").data);
  const auto& scores_t = r.output("scores");
  const std::int64_t k = scores_t.shape.size() > 1 ? scores_t.shape[1] : 0;
  const auto scores = as<float>(scores_t.data);
  const auto labels = as<std::int64_t>(r.output("labels").data);
  const auto boxes = as<float>(r.output("boxes").data);
  const auto names = unpack_bytes(r.output("label_names").data);
  std::cout << std::fixed << std::setprecision(4);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    std::cout << images[i] << ": " << counts[i] << " detections (model " << r.model_name
              << " version " << r.model_version << ")\n";
    for (std::int32_t j = 0; j < counts[i]; ++j) {
      const std::size_t at = i * k + j;
      std::cout << "  " << std::setw(16) << std::left << names[at] << std::right << " label "
                << labels[at] << " score " << scores[at] << " box [" << std::setprecision(1)
                << boxes[at * 4] << ", " << boxes[at * 4 + 1] << ", " << boxes[at * 4 + 2] << ", "
                << boxes[at * 4 + 3] << "]" << std::setprecision(4) << "\n";
    }
  }
  return 0;
}
