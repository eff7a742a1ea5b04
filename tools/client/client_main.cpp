// libreyolo-client: talks to libreyolo-server over gRPC (inference.GRPCInferenceService).
//   libreyolo-client detect --image FILE [--image FILE ...] [--server HOST:PORT] [--model NAME]
//                           [--threshold T] [--timeout SECONDS] [--out PNG]
//                           [--prompt "a cat. a dog." [--task TEXT] [--nms-threshold IOU]]
//                           (--out: the first image with its boxes drawn on, or its panoptic
//                           segments painted on when the model is a panoptic segmenter;
//                           --prompt: an open-vocabulary detector's labels, one prompt shared by
//                           the images; the boxes are captioned with their phrases; --task:
//                           OmDet-Turbo's task sentence, the request parameter `task`;
//                           --nms-threshold: its per-class NMS IoU, `nms_threshold`)
//   libreyolo-client classify --image FILE [--image FILE ...] [--server HOST:PORT] [--model NAME]
//                             [--top-k K] [--timeout SECONDS]
//   libreyolo-client segment --model NAME --image FILE [--image FILE ...] [--out PNG]
//                            [--server HOST:PORT] [--threshold T] [--timeout SECONDS]
//                            (instance masks; --out: the first image with its masks painted on)
//   libreyolo-client health [--server HOST:PORT] [--service NAME]
//   libreyolo-client call METHOD [TEXT] [--server HOST:PORT]   (e.g. call ModelConfig 'name: "m"')
//   libreyolo-client --help   (the usage on stdout, exit 0)
// Exit status: 0 on success, 1 on a gRPC error (its code and message on stderr), 2 on usage errors
// (the usage on stderr).
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "server/grpc/client.h"
#include "server/security/tls.h"
#include "tools/client/overlay.h"

namespace {

using namespace libreyolo::server;

/// The usage text: on stdout with exit status 0 when asked for (--help), else on stderr with 2.
int usage(bool asked = false) {
  (asked ? std::cout : std::cerr)
      << "usage: libreyolo-client detect --image FILE [--image FILE ...] [--server "
         "HOST:PORT] [--model NAME]\n"
         "                              [--threshold T] [--timeout SECONDS] [--out PNG]\n"
         "                              [--prompt \"a cat. a dog.\" [--task TEXT] "
         "[--nms-threshold IOU]]\n"
         "                              (open-vocabulary detectors; --task, --nms-threshold: "
         "OmDet-Turbo's task sentence and NMS IoU)\n"
         "       libreyolo-client classify --image FILE [--image FILE ...] [--server "
         "HOST:PORT] [--model NAME]\n"
         "                                [--top-k K] [--timeout SECONDS]\n"
         "       libreyolo-client segment --model NAME --image FILE [--image FILE ...] "
         "[--out PNG] [--server HOST:PORT]\n"
         "                               [--threshold T] [--timeout SECONDS]\n"
         "       libreyolo-client health [--server HOST:PORT] [--service NAME]\n"
         "       libreyolo-client call METHOD [REQUEST_TEXT] [--server HOST:PORT]\n"
         "every command: [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] (TLS, mutual TLS)\n"
         "               [--tls-server-name NAME] (the name the server's certificate must "
         "carry; default: the host of --server)\n"
         "               [--header KEY=VALUE]... (gRPC metadata, e.g. a restricted API's key)\n"
         "defaults: --server localhost:8001 --model rtdetr_tiny (detect), vit_tiny "
         "(classify); segment needs --model\n"
         "       libreyolo-client --help\n";
  return asked ? 0 : 2;
}

template <class T>
std::vector<T> as(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
}

/// Pixels of mask j of image i in a `masks` UINT8 [N,K,H,W] output.
std::int64_t mask_pixels(const api::OutputTensor& masks, std::size_t i, std::int32_t j) {
  if (masks.shape.size() != 4) return 0;
  const std::int64_t plane = masks.shape[2] * masks.shape[3];
  const std::int64_t at = (static_cast<std::int64_t>(i) * masks.shape[1] + j) * plane;
  if (at + plane > static_cast<std::int64_t>(masks.data.size())) return 0;
  std::int64_t n = 0;
  for (std::int64_t p = 0; p < plane; ++p) n += masks.data[at + p] != 0;
  return n;
}

int fail(api::Code code, const std::string& message) {
  std::cerr << "error: " << api::code_name(code) << ": " << message << "\n";
  return 1;
}

/// One block per image: "<file>: top K (model M version V)" then "  <label name>  <probability>
/// (label <index>)" lines, most probable first.
int print_classes(const rpc::InferResult& r, const std::vector<std::string>& images) {
  const auto& scores_t = r.output("scores");
  if (scores_t.shape.size() != 2 || scores_t.datatype != "FP32")
    return fail(api::Code::internal, "the server's 'scores' output is not FP32 [N,K]");
  const std::int64_t k = scores_t.shape[1];
  const auto scores = as<float>(scores_t.data);
  const auto labels = as<std::int64_t>(r.output("labels").data);
  const auto names = rpc::unpack_bytes(r.output("label_names").data);
  const std::size_t expected = images.size() * static_cast<std::size_t>(k);
  if (scores.size() != expected || labels.size() != expected || names.size() != expected)
    return fail(api::Code::internal, "the server's top-k outputs disagree in size");
  std::cout << std::fixed << std::setprecision(4);
  for (std::size_t i = 0; i < images.size(); ++i) {
    std::cout << images[i] << ": top " << k << " (model " << r.model_name << " version "
              << r.model_version << ")\n";
    for (std::int64_t j = 0; j < k; ++j) {
      const std::size_t at = i * k + j;
      std::cout << "  " << std::setw(24) << std::left << names[at] << std::right << " "
                << scores[at] << "  (label " << labels[at] << ")\n";
    }
  }
  return 0;
}

/// Writes `png` to `path`; std::runtime_error "cannot write <path>" when that fails.
void write_png(const std::string& path, const std::vector<std::uint8_t>& png) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// What detect --prompt sends besides the images (server/README.md "Open-vocabulary detection
/// I/O"): the labels shared by the images and the request parameters left out when unset.
struct PromptRequest {
  std::string prompt;         ///< the `text` input, e.g. "a cat. a dog."
  std::string task;           ///< `task` (OmDet-Turbo's task sentence); "" = unset
  double nms_threshold = -1;  ///< `nms_threshold` (OmDet-Turbo's NMS IoU); < 0 = unset
};

/// detect --prompt: an open-vocabulary detector with `p`; prints each image's boxes with their
/// phrases and, with `out_png`, draws the first image's boxes captioned with them.
int detect_prompted(rpc::Client& client, const std::string& model,
                    const std::vector<std::string>& images, const std::vector<std::string>& data,
                    const PromptRequest& p, double threshold, double timeout,
                    const std::string& out_png) {
  std::ostringstream text;
  text << "model_name: \"" << rpc::text_escape(model)
       << "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " << data.size()
       << " } inputs { name: \"text\" datatype: \"BYTES\" shape: 1 }";
  if (threshold >= 0)
    text << " parameters { key: \"box_threshold\" value { double_param: " << threshold << " } }";
  if (!p.task.empty())
    text << " parameters { key: \"task\" value { string_param: \"" << rpc::text_escape(p.task)
         << "\" } }";
  if (p.nms_threshold >= 0)
    text << " parameters { key: \"nms_threshold\" value { double_param: " << p.nms_threshold
         << " } }";
  text << " outputs { name: \"scores\" } outputs { name: \"labels\" } outputs { name: "
          "\"label_ids\" } outputs { name: \"boxes\" } outputs { name: \"num_detections\" }";
  const auto r =
      client.infer(text.str(), {rpc::pack_bytes(data), rpc::pack_bytes({p.prompt})}, timeout);
  if (!r.ok()) return fail(r.code, r.message);
  std::vector<std::int32_t> counts;
  std::vector<float> scores, boxes;
  std::vector<std::int64_t> ids;
  std::vector<std::string> phrases;
  std::int64_t k = 0;
  try {
    counts = as<std::int32_t>(r.output("num_detections").data);
    k = r.output("scores").shape.size() > 1 ? r.output("scores").shape[1] : 0;
    scores = as<float>(r.output("scores").data);
    boxes = as<float>(r.output("boxes").data);
    ids = as<std::int64_t>(r.output("label_ids").data);
    phrases = rpc::unpack_bytes(r.output("labels").data);
    const auto& params = r.output("labels").parameters;
    if (const auto it = params.find("truncated_labels"); it != params.end())
      if (const auto* cut = std::get_if<std::string>(&it->second))
        std::cerr << "note: labels cut to the model's token limit (image:label): " << *cut << "\n";
  } catch (const std::out_of_range& e) {
    return fail(api::Code::internal, e.what());
  }
  const std::size_t expected = counts.size() * static_cast<std::size_t>(k);
  if (counts.size() != images.size() || scores.size() != expected || ids.size() != expected ||
      phrases.size() != expected || boxes.size() != expected * 4)
    return fail(api::Code::internal, "the server's detection outputs disagree in size");
  std::cout << std::fixed << std::setprecision(4);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    std::cout << images[i] << ": " << counts[i] << " detections (model " << r.model_name
              << " version " << r.model_version << ")\n";
    for (std::int32_t j = 0; j < counts[i]; ++j) {
      const std::size_t at = i * k + j;
      std::cout << "  " << std::setw(24) << std::left << phrases[at] << std::right << " score "
                << scores[at] << " box [" << std::setprecision(1) << boxes[at * 4] << ", "
                << boxes[at * 4 + 1] << ", " << boxes[at * 4 + 2] << ", " << boxes[at * 4 + 3]
                << "]" << std::setprecision(4) << "\n";
    }
  }
  if (out_png.empty()) return 0;
  const std::int32_t n0 = counts.empty() ? 0 : std::max(0, counts[0]);
  try {
    const std::vector<std::string> captions(phrases.begin(), phrases.begin() + n0);
    const auto png =
        libreyolo::client::box_overlay_png(data[0], boxes.data(), ids.data(), n0, captions);
    write_png(out_png, png);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cout << "wrote " << out_png << " (" << n0 << " captioned boxes over " << images[0] << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return usage(true);
  }
  if (argc < 2) return usage();
  const std::string command = argv[1];
  std::string server = "localhost:8001", model, service, out_png;
  PromptRequest prompted;
  std::vector<std::string> images, positional;
  double threshold = -1, timeout = 30;
  long long top_k = 0;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  std::vector<std::pair<std::string, std::string>> headers;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    // The flag's value as a whole number (std::stod alone says only "stod" and takes "0.5x").
    auto number = [&]() -> double {
      const std::string v = value();
      std::size_t used = 0;
      double d = 0;
      try {
        d = std::stod(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != v.size())
        throw std::invalid_argument(a + " needs a number, got '" + v + "'");
      return d;
    };
    try {
      if (a == "--server")
        server = value();
      else if (a == "--model")
        model = value();
      else if (a == "--image")
        images.push_back(value());
      else if (a == "--threshold")
        threshold = number();
      else if (a == "--timeout")
        timeout = number();
      else if (a == "--top-k") {
        std::size_t used = 0;
        const std::string v = value();
        top_k = std::stoll(v, &used);
        if (used != v.size() || top_k < 1) throw std::invalid_argument("--top-k needs K >= 1");
      } else if (a == "--service")
        service = value();
      else if (a == "--out")
        out_png = value();
      else if (a == "--prompt")
        prompted.prompt = value();
      else if (a == "--task")
        prompted.task = value();
      else if (a == "--nms-threshold")
        prompted.nms_threshold = number();
      else if (a == "--tls-ca")
        tls_ca = value();
      else if (a == "--tls-cert")
        tls_cert = value();
      else if (a == "--tls-key")
        tls_key = value();
      else if (a == "--tls-server-name")
        tls_server_name = value();
      else if (a == "--header") {
        const std::string v = value();
        const auto eq = v.find('=');
        if (eq == std::string::npos || eq == 0)
          throw std::invalid_argument("--header needs KEY=VALUE, got '" + v + "'");
        headers.emplace_back(v.substr(0, eq), v.substr(eq + 1));
      } else if (a.rfind("--", 0) == 0)
        return usage();
      else
        positional.push_back(a);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return usage();
    }
  }
  std::optional<rpc::ClientTls> tls;
  if (!tls_ca.empty() || !tls_cert.empty() || !tls_key.empty() || !tls_server_name.empty()) {
    if (tls_ca.empty() || tls_cert.empty() != tls_key.empty()) {
      std::cerr << "--tls-ca is needed with TLS, and --tls-cert and --tls-key go together\n";
      return usage();
    }
    try {
      tls.emplace();
      tls->root_certificates = security::read_file(tls_ca, "CA file");
      tls->server_name = tls_server_name;
      if (!tls_cert.empty()) {
        tls->certificate_chain = security::read_file(tls_cert, "certificate file");
        tls->private_key = security::read_file(tls_key, "key file");
      }
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  rpc::Client client(server, 64u << 20, tls);
  for (const auto& [k, v] : headers) client.add_metadata(k, v);
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
  const bool segment = command == "segment";
  if ((command != "detect" && command != "classify" && !segment) || images.empty()) return usage();
  if (!out_png.empty() && command == "classify") return usage();
  if (segment && model.empty()) {
    std::cerr << "segment needs --model NAME (an instance segmentation model)\n";
    return usage();
  }
  if (model.empty()) model = command == "detect" ? "rtdetr_tiny" : "vit_tiny";
  std::vector<std::string> data;
  for (const auto& path : images) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::cerr << "cannot read " << path << "\n";
      return 2;
    }
    data.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // --task and --nms-threshold need --prompt
  if ((!prompted.task.empty() || prompted.nms_threshold >= 0) && prompted.prompt.empty())
    return usage();
  if (!prompted.prompt.empty()) {
    if (command != "detect") return usage();
    return detect_prompted(client, model, images, data, prompted, threshold, timeout, out_png);
  }
  std::ostringstream text;
  text << "model_name: \"" << rpc::text_escape(model)
       << "\" inputs { name: \"images\" datatype: \"BYTES\" shape: " << data.size() << " }";
  if (threshold >= 0)
    text << " parameters { key: \"threshold\" value { double_param: " << threshold << " } }";
  if (top_k > 0) text << " parameters { key: \"top_k\" value { int64_param: " << top_k << " } }";
  // The outputs printed, named explicitly: a model of the other kind answers INVALID_ARGUMENT
  // (a detector has no `probabilities`, a classifier no `boxes`) instead of other tensors.
  text << " outputs { name: \"scores\" } outputs { name: \"labels\" } outputs { name: "
          "\"label_names\" }";
  if (command == "classify")
    text << " outputs { name: \"probabilities\" }";
  else
    text << " outputs { name: \"boxes\" } outputs { name: \"num_detections\" }";
  if (segment) text << " outputs { name: \"masks\" }";
  // detect --out: a panoptic segmenter (DetrForSegmentation) also answers its segmentation map,
  // painted instead of the boxes; any other detector refuses that output and is asked again.
  const bool try_panoptic = command == "detect" && !out_png.empty();
  auto r = client.infer(text.str() + (try_panoptic ? " outputs { name: \"segmentation\" }" : ""),
                        {rpc::pack_bytes(data)}, timeout);
  if (try_panoptic && r.code == api::Code::invalid_argument &&
      r.message.find("unknown output 'segmentation'") != std::string::npos)
    r = client.infer(text.str(), {rpc::pack_bytes(data)}, timeout);
  if (!r.ok()) {
    // The outputs asked for name the model's kind: point at the command that fits it.
    std::string hint;
    if (r.code == api::Code::invalid_argument &&
        r.message.find("unknown output 'probabilities'") != std::string::npos)
      hint = " (" + model + " is an object detector: use `libreyolo-client detect`)";
    if (r.code == api::Code::invalid_argument &&
        r.message.find("unknown output 'boxes'") != std::string::npos)
      hint = " (" + model + " is an image classifier: use `libreyolo-client classify`)";
    if (r.code == api::Code::invalid_argument &&
        r.message.find("unknown output 'masks'") != std::string::npos)
      hint = " (" + model + " has no masks: use `libreyolo-client detect`)";
    return fail(r.code, r.message + hint);
  }
  if (command == "classify") {
    try {
      return print_classes(r, images);
    } catch (const std::out_of_range& e) {  // an output missing from the answer
      return fail(api::Code::internal, e.what());
    }
  }
  const auto counts = as<std::int32_t>(r.output("num_detections").data);
  const auto& scores_t = r.output("scores");
  const std::int64_t k = scores_t.shape.size() > 1 ? scores_t.shape[1] : 0;
  const auto scores = as<float>(scores_t.data);
  const auto labels = as<std::int64_t>(r.output("labels").data);
  const auto boxes = as<float>(r.output("boxes").data);
  const auto names = rpc::unpack_bytes(r.output("label_names").data);
  std::cout << std::fixed << std::setprecision(4);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    std::cout << images[i] << ": " << counts[i] << " detections (model " << r.model_name
              << " version " << r.model_version << ")\n";
    for (std::int32_t j = 0; j < counts[i]; ++j) {
      const std::size_t at = i * k + j;
      std::cout << "  " << std::setw(16) << std::left << names[at] << std::right << " label "
                << labels[at] << " score " << scores[at] << " box [" << std::setprecision(1)
                << boxes[at * 4] << ", " << boxes[at * 4 + 1] << ", " << boxes[at * 4 + 2] << ", "
                << boxes[at * 4 + 3] << "]" << std::setprecision(4);
      if (segment) std::cout << " mask " << mask_pixels(r.output("masks"), i, j) << " px";
      std::cout << "\n";
    }
  }
  const api::OutputTensor* panoptic = nullptr;
  for (const auto& o : r.outputs)
    if (o.name == "segmentation") panoptic = &o;
  if (!out_png.empty() && panoptic) {
    const auto& m = *panoptic;
    if (m.datatype != "INT32" || m.shape.size() != 3 || m.shape[0] < 1 ||
        static_cast<std::int64_t>(m.data.size()) != m.shape[0] * m.shape[1] * m.shape[2] * 4)
      return fail(api::Code::internal, "the server's 'segmentation' output is not INT32 [N,H,W]");
    try {
      const auto map = as<std::int32_t>(m.data);
      const auto png = libreyolo::client::panoptic_overlay_png(data[0], map.data(), m.shape[1],
                                                               m.shape[2], m.shape[2]);
      write_png(out_png, png);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
    std::cout << "wrote " << out_png << " (panoptic segments over " << images[0] << ")\n";
  }
  if (!out_png.empty() && !segment && !panoptic) {
    const std::int32_t n0 = counts.empty() ? 0 : counts[0];
    if (n0 < 0 || boxes.size() < static_cast<std::size_t>(n0) * 4 ||
        labels.size() < static_cast<std::size_t>(n0))
      return fail(api::Code::internal, "the server's 'boxes'/'labels' outputs are too short");
    try {
      const auto png = libreyolo::client::box_overlay_png(data[0], boxes.data(), labels.data(), n0);
      write_png(out_png, png);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
    std::cout << "wrote " << out_png << " (" << n0 << " boxes over " << images[0] << ")\n";
  }
  if (!out_png.empty() && segment) {
    const auto& m = r.output("masks");
    if (m.datatype != "UINT8" || m.shape.size() != 4 ||
        m.shape[0] != static_cast<std::int64_t>(counts.size()) ||
        static_cast<std::int64_t>(m.data.size()) !=
            m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3])
      return fail(api::Code::internal, "the server's 'masks' output is not UINT8 [N,K,H,W]");
    try {
      const auto png = libreyolo::client::mask_overlay_png(
          data[0], reinterpret_cast<const std::uint8_t*>(m.data.data()), counts[0], m.shape[2],
          m.shape[3], m.shape[3], m.shape[2] * m.shape[3]);
      write_png(out_png, png);
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
    std::cout << "wrote " << out_png << " (" << counts[0] << " masks over " << images[0] << ")\n";
  }
  return 0;
}
