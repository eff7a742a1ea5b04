// libreyolo-bench-models: end-to-end forward time of one checkpoint on random pixels.
//
//   libreyolo-bench-models --model DIR [--size 640|HxW] [--batch 1,8,32] [--device cpu|cuda]
//                          [--dtype float32|float16|bfloat16] [--iters N] [--warmup N] [--tf32]
//                          [--cuda-graph] [--fused-attention default|on|off]
//                          [--layouts default|on|off] [--out FILE.json] [--profile]
//                          [--profile-launches] [--no-cudnn-benchmark] [--prompt "a cat. a dog."]
//                          [--prompt-cache on|off|off,on] [--quantization none|fp8]
//                          [--slot SLOT=IMPL,IMPL ...] [--flush-denormals default|on|off]
//                          [--kernel-config CLASS=LAYOUT|off ...]
// Prints one line per batch size: ms per forward (median of --iters, after --warmup), images/s,
// and the kernel calls counted per implementation of ms_deform_attn, so that a run under
// LIBREYOLO_KERNELS=reference (portable path) and one without can be compared; then one
// `binding model=M slot=S selected=I <impl>.calls=N <impl>.declined=N ...` line per slot the
// model is bound to (models/layers/bound_kernels.h; counters of this model's handles since load,
// warm-up and graph replays included), so a run shows which implementation served each slot
// (e.g. conv2d_bias_act cuda.calls > 0 with layouts on). --size HxW (e.g. 800x1333) times a
// non-square input (Deformable DETR's shortest-edge 800 / longest-edge 1333). CUDA time is
// wall time around a synchronised forward (what a request sees), TF32 off unless --tf32 (PyTorch's
// own default lets cuDNN convolutions use TF32, which is what a transformers eager run measures).
// --cuda-graph times models::CudaGraphRunner (the daemon's `cuda_graphs`): one captured forward
// per batch size, replayed (no host launch cost; includes the input copy and output clone); a
// model that cannot be captured prints `cuda_graph=failed` and the reason.
// --fused-attention sets the model's attention path (Model::set_fused_attention; `default` is the
// daemon's: on for CUDA and CPU float16/bfloat16, the family's default otherwise; printed as
// `default(on)` when the device rule turned it on), so that manual and fused attention are timed
// on the same checkpoint.
// --profile (CUDA) adds, per batch size, the GPU time of one eager forward by op class (conv,
// gemm, elementwise, ...) from the torch profiler (tools/bench_models/profile.h);
// --profile-launches also lists one forward's kernels (CPU: leaf ops) in launch order.
// --quantization fp8 loads the model as serving.yaml `quantization: fp8` does
// (models/quantization/fp8.h: the transformer blocks' Linear layers through the fp8_gemm slot);
// what it did goes to stderr and into the JSON file, and a `fp8_agreement` line compares it with
// the same checkpoint loaded in the model's dtype on the first batch size's normalised (randn)
// pixels (issue 34's bar: logits' row cosine >= 0.999, top-1 agreement, boxes within 1e-2 over
// each image's 100 best queries by the unquantised scores; two-stage detectors pick their queries
// by a top-k that any perturbation of random-weight ties reorders, so their boxes may compare
// different queries).
// --flush-denormals (CPU) sets flush-to-zero / denormals-are-zero on the timing thread and its
// OpenMP team (models/runtime/cpu_math.h); `default` is the daemon's (on for CPU bfloat16 /
// float16 models, off for float32), printed as `default(on)` / `default(off)`.
// --layouts picks the layouts (models/layouts/; not given: LIBREYOLO_LAYOUTS, else default); what
// was applied goes to stderr and, with --out, into the JSON file with every timed line.
// --kernel-config CLASS=VALUE (repeatable) is one serving.yaml `kernel_config:` entry for every
// module of that transformers class (VALUE a layout name or `off`), e.g. --kernel-config
// Conv2d=off: the defaults without channels_last, an A/B of one layout on the same build.
// cuDNN benchmark mode is on, as in the daemon (server.yaml `cudnn_benchmark`) and the anchors
// (tools/bench_models/anchors.py); --no-cudnn-benchmark uses cuDNN's heuristics instead.
// Open-vocabulary models (models/prompted.h: OWL-ViT, OWLv2, Grounding DINO) take text with
// every forward: --prompt gives the labels of every image of the batch, separated by '.' and
// stripped ("a cat. a dog." = {"a cat", "a dog"}; Grounding DINO's processor joins them back
// into that caption); default "a cat. a dog.". --prompt-cache picks how the text side is timed
// (a comma list times each in turn; default on): `off` is the daemon without its prompt cache
// (serving.yaml prompt_cache_mb 0): encode_labels and forward_prompted inside each timed
// forward, so the text encoder runs every time; `on` is the daemon's prompt cache after its
// first request (server/instance/prompt_cache.h: every piece a hit): text_keys and encode_text
// once before timing, then forward_encoded (OWL: vision tower and heads; Grounding DINO:
// everything after BERT; OmDet-Turbo: everything after CLIP, with the default task). A family that
// does not cache its text (PromptedDetector::caches_text false) prints `prompt_cache=n/a` and times
// nothing under `on`. Prompted forwards are not captured in CUDA graphs (the daemon runs them
// eagerly): --cuda-graph with a prompted model is a usage error.
// --slot SLOT=IMPL,... (repeatable) restricts one slot to those implementations, as a model's
// serving.yaml `kernels.slots.SLOT.allow` does (models::LoadOptions::kernel_slots); nothing after
// '=' leaves the slot its portable path: an A/B of one implementation on the same build, e.g.
// --slot max_pool2d= against the default.
// Exit codes: 0 ok, 1 runtime error, 2 usage error.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention/ms_deform_attn.h"
#include "kernels/kernels.h"
#include "kernels/policy.h"
#include "kernels/registry.h"
#include "log/log.h"
#include "models/layers/attention.h"
#include "models/layouts/kernel_config.h"
#include "models/layouts/options.h"
#include "models/model.h"
#include "models/prompted.h"
#include "models/runtime/cpu_math.h"
#include "models/runtime/cuda_graph_runner.h"
#include "tools/bench_models/profile.h"

namespace {

int usage() {
  std::cerr << "usage: libreyolo-bench-models --model DIR [--size 640|HxW] [--batch 1,8] "
               "[--device cpu|cuda] [--dtype float32|float16|bfloat16] [--iters N] [--warmup N] "
               "[--tf32] [--cuda-graph] [--fused-attention default|on|off] "
               "[--layouts default|on|off] [--out FILE.json] [--profile] [--profile-launches] "
               "[--no-cudnn-benchmark] "
               "[--prompt \"a cat. a dog.\"] [--prompt-cache on|off|off,on] "
               "[--quantization none|fp8] [--slot SLOT=IMPL,IMPL ...] "
               "[--flush-denormals default|on|off] [--kernel-config CLASS=LAYOUT|off ...]\n";
  return 2;
}

void synchronize(const at::Device& device) {
  if (device.is_cuda())
    at::empty({1}, at::TensorOptions().device(device)).cpu();  // drains the stream
}

std::string msda_calls() {
  std::ostringstream os;
  for (const auto& s : libreyolo::kernels::Registry::process_default().report()) {
    if (s.slot != libreyolo::kernels::kMsDeformAttn.name) continue;
    os << "selected=" << s.selected;
    for (const auto& c : s.candidates) os << " " << c.name << ".calls=" << c.calls;
  }
  return os.str();
}

/// One line per binding of the process registry (this tool loads one model):
/// "binding model=M slot=S selected=I cuda.calls=N cuda.declined=N(reason=N; ...) ...".
std::string binding_lines(nlohmann::json* out) {
  std::ostringstream os;
  for (const auto& b : libreyolo::kernels::Registry::process_default().bindings()) {
    os << "binding model=" << b.model << " slot=" << b.slot << " selected=" << b.selected;
    if (b.candidates.empty()) os << " (no implementation bound: the portable path runs)";
    nlohmann::json candidates = nlohmann::json::array();
    for (const auto& c : b.candidates) {
      if (!c.eligible) {
        os << " " << c.name << "=not_bound(" << c.reason << ")";
        candidates.push_back({{"name", c.name}, {"bound", false}, {"reason", c.reason}});
        continue;
      }
      std::uint64_t declined = 0;
      std::string why;
      for (const auto& [reason, n] : c.declined) {
        declined += n;
        why += (why.empty() ? "" : "; ") + reason + "=" + std::to_string(n);
      }
      os << " " << c.name << ".calls=" << c.calls << " " << c.name << ".declined=" << declined;
      if (!why.empty()) os << "(" << why << ")";
      if (c.disabled) os << " " << c.name << "=disabled";
      candidates.push_back({{"name", c.name},
                            {"bound", true},
                            {"calls", c.calls},
                            {"declined", c.declined},
                            {"disabled", c.disabled}});
    }
    os << "\n";
    if (out)
      out->push_back({{"model", b.model},
                      {"slot", b.slot},
                      {"selected", b.selected},
                      {"candidates", candidates}});
  }
  return os.str();
}

/// "640" -> {640, 640}; "800x1333" -> {800, 1333}. Throws std::invalid_argument otherwise.
std::pair<int64_t, int64_t> parse_size(const std::string& text) {
  const auto x = text.find('x');
  size_t used = 0;
  const int64_t h = std::stoll(text.substr(0, x), &used);
  if (used != (x == std::string::npos ? text.size() : x)) throw std::invalid_argument(text);
  if (x == std::string::npos) return {h, h};
  const std::string rest = text.substr(x + 1);
  const int64_t w = std::stoll(rest, &used);
  if (used != rest.size()) throw std::invalid_argument(text);
  return {h, w};
}

}  // namespace

/// The `fp8_agreement` line (see the header): `dense` and `fp8`, the same checkpoint without and
/// with `quantization: fp8`, on one batch of normalised (randn) pixels (batch, 3, height, width)
/// of `options`' device and dtype.
void print_fp8_agreement(const libreyolo::models::Model& dense, const libreyolo::models::Model& fp8,
                         const libreyolo::models::LoadOptions& options, int64_t batch,
                         int64_t height, int64_t width) {
  at::manual_seed(9);
  const auto x = at::randn({batch, 3, height, width}, at::TensorOptions().device(options.device))
                     .to(options.dtype);
  const auto a = dense.forward(x), f = fp8.forward(x);
  const auto la = a.logits.flatten(0, -2).to(at::kFloat),
             lf = f.logits.flatten(0, -2).to(at::kFloat);
  const auto cos = at::cosine_similarity(la, lf, 1);
  const double top1 = la.argmax(1).eq(lf.argmax(1)).to(at::kFloat).mean().item<double>();
  std::cout << "fp8_agreement batch=" << batch << " rows=" << la.size(0)
            << " min_row_cosine=" << cos.min().item<double>()
            << " mean_row_cosine=" << cos.mean().item<double>() << " top1_agreement=" << top1;
  if (a.pred_boxes.defined() && f.pred_boxes.defined() && a.logits.dim() == 3) {
    // Each image's 100 best queries by the unquantised model's best class score.
    const int64_t k = std::min<int64_t>(100, a.logits.size(1));
    const auto best = std::get<1>(a.logits.to(at::kFloat).amax(-1).topk(k, 1));
    const auto idx = best.unsqueeze(-1).expand({-1, -1, 4});
    const double diff =
        (a.pred_boxes.to(at::kFloat).gather(1, idx) - f.pred_boxes.to(at::kFloat).gather(1, idx))
            .abs()
            .max()
            .item<double>();
    std::cout << " max_box_diff_top" << k << "=" << diff;
  }
  std::cout << std::endl;
}

int main(int argc, char** argv) {
  // LIBREYOLO_LOG_LEVEL=debug shows the kernels' own lines (cudnn_graph's per-geometry timings);
  // the default keeps the daemon's info level.
  if (const char* env = std::getenv("LIBREYOLO_LOG_LEVEL"); env && *env) {
    try {
      libreyolo::log::set_level(libreyolo::log::parse_level(env));
    } catch (const std::invalid_argument& e) {
      std::cerr << "libreyolo-bench-models: LIBREYOLO_LOG_LEVEL: " << e.what() << "\n";
      return 2;
    }
  }
  std::string model_dir, device_name = "cpu", dtype_name = "float32", batches = "1,8";
  std::string fused = "default", flush = "default", layouts, out, prompt = "a cat. a dog.",
              cache_modes = "on";
  std::string quantization = "none";
  libreyolo::kernels::SlotAllow slots;
  std::vector<libreyolo::models::layouts::KernelConfigEntry> kernel_config;
  int64_t height = 640, width = 640;
  int iters = 10, warmup = 3;
  bool tf32 = false, cuda_graph = false, profile = false, profile_launches = false,
       cudnn_benchmark = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    try {
      if (a == "--model")
        model_dir = next();
      else if (a == "--size")
        std::tie(height, width) = parse_size(next());
      else if (a == "--batch")
        batches = next();
      else if (a == "--device")
        device_name = next();
      else if (a == "--dtype")
        dtype_name = next();
      else if (a == "--iters")
        iters = std::stoi(next());
      else if (a == "--warmup")
        warmup = std::stoi(next());
      else if (a == "--tf32")
        tf32 = true;
      else if (a == "--no-cudnn-benchmark")
        cudnn_benchmark = false;
      else if (a == "--cuda-graph")
        cuda_graph = true;
      else if (a == "--fused-attention")
        fused = next();
      else if (a == "--flush-denormals")
        flush = next();
      else if (a == "--profile")
        profile = true;
      else if (a == "--profile-launches")
        profile = profile_launches = true;
      else if (a == "--layouts")
        layouts = next();
      else if (a == "--out")
        out = next();
      else if (a == "--prompt")
        prompt = next();
      else if (a == "--prompt-cache")
        cache_modes = next();
      else if (a == "--quantization")
        quantization = next();
      else if (a == "--slot") {
        const std::string spec = next();
        const auto eq = spec.find('=');
        if (eq == std::string::npos || eq == 0) return usage();
        auto& allow = slots[spec.substr(0, eq)];
        std::stringstream names(spec.substr(eq + 1));
        for (std::string name; std::getline(names, name, ',');)
          if (!name.empty()) allow.push_back(name);
      } else if (a == "--kernel-config") {
        // Through serving.yaml's parser: an unknown class or layout is the same error there.
        const std::string spec = next();
        const auto eq = spec.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) return usage();
        for (auto& e : libreyolo::models::layouts::parse_kernel_config_text(
                 "{" + spec.substr(0, eq) + ": " + spec.substr(eq + 1) + "}", "--kernel-config"))
          kernel_config.push_back(std::move(e));
      } else
        return usage();
    } catch (const std::exception& e) {
      std::cerr << a << ": " << e.what() << "\n";
      return usage();
    }
  }
  if (model_dir.empty() || iters < 1 || warmup < 0 || height < 32 || width < 32) return usage();
  if (cuda_graph && device_name.rfind("cuda", 0) != 0) return usage();
  if (fused != "default" && fused != "on" && fused != "off") return usage();
  if (flush != "default" && flush != "on" && flush != "off") return usage();
  if (quantization != "none" && quantization != "fp8") return usage();
  if (!layouts.empty() && layouts != "default" && layouts != "on" && layouts != "off")
    return usage();
  const std::vector<std::string> labels = libreyolo::models::split_labels(prompt);
  std::vector<std::string> caches;
  {
    std::stringstream list(cache_modes);
    std::string item;
    while (std::getline(list, item, ',')) {
      if (item != "on" && item != "off") return usage();
      caches.push_back(item);
    }
  }
  if (labels.empty() || caches.empty()) return usage();
  if (!out.empty() && (out.size() < 5 || out.substr(out.size() - 5) != ".json")) return usage();
  namespace kernels = libreyolo::kernels;
  try {
    const auto policy = kernels::policy_from_environment(kernels::process_environment());
    kernels::initialize(policy);
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
    at::globalContext().setBenchmarkCuDNN(cudnn_benchmark);  // the daemon's default
    libreyolo::models::LoadOptions options;
    options.device = at::Device(device_name);
    options.dtype = dtype_name == "float16"    ? at::kHalf
                    : dtype_name == "bfloat16" ? at::kBFloat16
                                               : at::kFloat;
    options.layouts.mode = policy.layouts;
    if (!layouts.empty())
      options.layouts.mode = {layouts == "on"    ? kernels::LayoutMode::on
                              : layouts == "off" ? kernels::LayoutMode::off
                                                 : kernels::LayoutMode::family_default,
                              kernels::Source::flag, "--layouts"};
    if (quantization == "fp8")
      options.quantization = libreyolo::models::quantization::Quantization::fp8;
    options.kernel_slots = slots;
    options.layouts.kernel_config = kernel_config;
    const auto model = libreyolo::models::load_model(model_dir, options);
    const auto& q = model->quantization();
    if (quantization == "fp8")
      std::cerr << "quantization fp8: "
                << (q.implementation.empty()
                        ? "off: " + q.unavailable
                        : "through " + q.implementation + ", " + std::to_string(q.fp8.layers) +
                              " layers, " + std::to_string(q.fp8.kept_shape) + " kept")
                << "\n";
    const auto& mode = options.layouts.mode;
    std::cerr << "layouts " << kernels::layout_mode_name(mode.value) << " ("
              << kernels::source_name(mode.source) << (mode.origin.empty() ? "" : " " + mode.origin)
              << "):\n"
              << libreyolo::models::layouts::describe(model->layouts());
    nlohmann::json report = {{"model", model_dir},
                             {"model_type", model->model_type()},
                             {"layouts",
                              {{"mode", kernels::layout_mode_name(mode.value)},
                               {"source", kernels::source_name(mode.source)},
                               {"applied", nlohmann::json::array()}}},
                             {"quantization",
                              {{"value", quantization},
                               {"implementation", q.implementation},
                               {"layers", q.fp8.layers},
                               {"kept_shape", q.fp8.kept_shape}}},
                             {"runs", nlohmann::json::array()}};
    for (const auto& r : model->layouts())
      report["layouts"]["applied"].push_back({{"layout", r.layout},
                                              {"source", r.source},
                                              {"classes", r.classes},
                                              {"modules_replaced", r.modules},
                                              {"params_before", r.params_before},
                                              {"params_after", r.params_after}});
    // `default` is what the daemon runs with no setting: the device rule
    // (models::layers::fused_attention_by_default), else the family's default.
    if (fused == "default" &&
        libreyolo::models::layers::fused_attention_by_default(options.device, options.dtype))
      fused = "default(on)";
    if (fused != "default") model->set_fused_attention(fused != "off");
    // As the daemon's instance thread does before its first forward (server/instance).
    if (options.device.is_cpu()) {
      const bool on =
          flush == "default"
              ? libreyolo::models::flush_denormals_by_default(static_cast<int>(options.dtype))
              : flush == "on";
      if (flush == "default") flush = on ? "default(on)" : "default(off)";
      if (on) libreyolo::models::flush_denormals_on_this_thread();
    }
    const std::string size_text = height == width
                                      ? std::to_string(height)
                                      : std::to_string(height) + "x" + std::to_string(width);
    at::InferenceMode guard;
    const auto* prompted = libreyolo::models::prompted_detector(*model);
    if (prompted && cuda_graph) {
      std::cerr << "libreyolo-bench-models: --cuda-graph: " << model->model_type()
                << " is open-vocabulary (prompted forwards run eagerly, as in the daemon)\n";
      return 2;
    }
    if (quantization == "fp8" && !q.implementation.empty() && !prompted) {
      auto dense_options = options;
      dense_options.quantization = libreyolo::models::quantization::Quantization::none;
      print_fp8_agreement(*libreyolo::models::load_model(model_dir, dense_options), *model, options,
                          std::stoll(batches.substr(0, batches.find(','))), height, width);
    }
    // A closed-set model runs once per batch size, whatever --prompt-cache says.
    if (!prompted) caches = {"-"};
    std::stringstream list(batches);
    std::string item;
    while (std::getline(list, item, ',')) {
      const int64_t b = std::stoll(item);
      const at::Tensor pixels =
          at::rand({b, 3, height, width}, at::TensorOptions().device(options.device))
              .to(options.dtype);
      for (const auto& cache : caches) {
        // The forward timed: the closed-set one, or the prompted one with the text side as
        // --prompt-cache says (see the header).
        std::function<void()> forward = [&] { model->forward(pixels); };
        const std::vector<std::vector<std::string>> prompts(static_cast<size_t>(b), labels);
        std::vector<std::vector<libreyolo::models::EncodedText>> pieces;
        if (prompted && cache == "off") {
          forward = [&] { prompted->forward_prompted(pixels, prompted->encode_labels(prompts)); };
        } else if (prompted) {
          if (!prompted->caches_text()) {
            std::cout << "model=" << model->model_type() << " batch=" << b
                      << " prompt_cache=n/a (the family does not cache its text encoding)"
                      << std::endl;
            continue;
          }
          // What the daemon's PromptCache hands forward_encoded when every piece is a hit (every
          // image has the same labels: image 0's pieces encoded once, shared).
          pieces.assign(static_cast<size_t>(b),
                        prompted->encode_text(prompted->text_keys({labels})[0]));
          forward = [&] { prompted->forward_encoded(pixels, at::Tensor(), pieces); };
        }
        for (int w = 0; w < warmup; ++w) forward();
        synchronize(options.device);
        std::unique_ptr<libreyolo::models::CudaGraphRunner> graph;
        if (cuda_graph) {
          try {
            graph = std::make_unique<libreyolo::models::CudaGraphRunner>(
                *model, std::vector<int64_t>{b}, height, width, options.dtype, options.device);
          } catch (const std::exception& e) {
            std::cout << "model=" << model->model_type() << " batch=" << b
                      << " cuda_graph=failed: " << e.what() << std::endl;
            continue;
          }
        }
        std::vector<double> ms;
        for (int it = 0; it < iters; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          if (graph)
            graph->run(pixels);
          else
            forward();
          synchronize(options.device);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        // The mean too: back-to-back forwards deliver batch / mean images a second, the figure a
        // served throughput (images over a window's wall time) compares with. On a VM whose
        // forwards spread by 15% (the 2-core CPUs), batch / median overstates it.
        double mean = 0;
        for (const double m : ms) mean += m;
        mean /= static_cast<double>(ms.size());
        std::cout << "model=" << model->model_type() << " dir=" << model_dir
                  << " device=" << device_name << " dtype=" << dtype_name
                  << " tf32=" << (tf32 ? "on" : "off")
                  << " cudnn_benchmark=" << (cudnn_benchmark ? "on" : "off")
                  << " cuda_graph=" << (cuda_graph ? "on" : "off") << " fused_attention=" << fused
                  << " flush_denormals=" << flush
                  << " layouts=" << kernels::layout_mode_name(mode.value) << " size=" << size_text
                  << " batch=" << b;
        if (prompted) std::cout << " prompt_cache=" << cache << " labels=" << labels.size();
        std::cout << " median_ms=" << median << " min_ms=" << ms.front() << " mean_ms=" << mean
                  << " images_per_s=" << (1000.0 * b / median) << " " << msda_calls() << std::endl;
        nlohmann::json bindings = nlohmann::json::array();
        std::cout << binding_lines(&bindings) << std::flush;
        if (profile) {
          std::cout << libreyolo::bench::profile_by_op_class(
                           [&] {
                             forward();
                             synchronize(options.device);
                           },
                           5, profile_launches)
                    << std::flush;
        }
        nlohmann::json run = {
            {"batch", b},
            {"size", height == width ? nlohmann::json(height) : nlohmann::json(size_text)},
            {"bindings", bindings},
            {"device", device_name},
            {"dtype", dtype_name},
            {"median_ms", median},
            {"min_ms", ms.front()},
            {"mean_ms", mean},
            {"images_per_s", 1000.0 * b / median}};
        if (prompted) {
          run["prompt_cache"] = cache;
          run["labels"] = labels;
        }
        report["runs"].push_back(run);
      }
    }
    if (!out.empty()) {
      std::ofstream f(out);
      if (!f) throw std::runtime_error(out + ": cannot open for writing");
      f << report.dump(1) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "libreyolo-bench-models: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
