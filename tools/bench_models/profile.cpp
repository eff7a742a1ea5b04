#include "tools/bench_models/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <vector>

namespace libreyolo::bench {
namespace {

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

/// The op class of a CUDA kernel, from its (mangled or plain) name.
std::string op_class(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (has(name, "ms_deform") || has(name, "msda")) return "ms_deform_attn";
  if (has(name, "fmha") || has(name, "attention") || has(name, "flash")) return "attention";
  if (has(name, "conv") || has(name, "xmma_fprop") || has(name, "implicit_gemm") ||
      has(name, "cudnn") || has(name, "fprop") || has(name, "dgrad") || has(name, "winograd"))
    return "conv";
  if (has(name, "gemm") || has(name, "cutlass") || has(name, "cublas") || has(name, "nvjet") ||
      has(name, "sm90_xmma"))
    return "gemm";
  if (has(name, "norm") || has(name, "softmax") || has(name, "reduce") || has(name, "topk") ||
      has(name, "sort") || has(name, "scan"))
    return "norm_softmax_reduce";
  if (has(name, "memcpy") || has(name, "memset") || has(name, "copy") || has(name, "cat") ||
      has(name, "index") || has(name, "gather") || has(name, "transpose"))
    return "copy";
  if (has(name, "elementwise") || has(name, "vectorized") || has(name, "unrolled") ||
      has(name, "pointwise") || has(name, "activation"))
    return "elementwise";
  return "other";
}

/// One CPU-side op of the trace (an aten op or a record_function range).
struct CpuOp {
  std::string name;
  uint64_t start = 0, end = 0, thread = 0;
};

/// The chain of ops that launched a kernel, outermost first ("aten::linear>aten::matmul>
/// aten::reshape>aten::clone>aten::copy_"): Kineto links each kernel to the innermost op on the
/// CPU (its external correlation id); the ops around it are those on the same thread whose time
/// range contains it. At most `depth` names, the innermost kept.
std::string op_chain(const CpuOp& inner, const std::vector<const CpuOp*>& ops_of_thread,
                     std::size_t depth) {
  std::vector<const CpuOp*> chain;
  for (const CpuOp* o : ops_of_thread) {
    if (o->start > inner.start) break;
    if (o->end >= inner.end) chain.push_back(o);
  }
  std::string out;
  const std::size_t from = chain.size() > depth ? chain.size() - depth : 0;
  for (std::size_t i = from; i < chain.size(); ++i)
    out += (out.empty() ? "" : ">") + chain[i]->name;
  return out;
}

/// The op class of an ATen operator on the CPU, from its name (aten::mkldnn_convolution, ...).
std::string cpu_op_class(const std::string& name) {
  if (has(name, "deform")) return "ms_deform_attn";
  if (has(name, "attention") || has(name, "sdpa") || has(name, "_flash")) return "attention";
  if (has(name, "conv")) return "conv";
  if (has(name, "mm") || has(name, "linear") || has(name, "matmul") || has(name, "baddbmm"))
    return "gemm";
  if (has(name, "pool")) return "pool";
  if (has(name, "norm") || has(name, "softmax") || has(name, "topk") || has(name, "sort") ||
      has(name, "aten::sum") || has(name, "aten::mean") || has(name, "aten::max") ||
      has(name, "aten::min") || has(name, "argmax") || has(name, "cumsum"))
    return "norm_softmax_reduce";
  if (has(name, "copy") || has(name, "cat") || has(name, "contiguous") || has(name, "clone") ||
      has(name, "index") || has(name, "gather") || has(name, "stack") || has(name, "pad") ||
      has(name, "grid_sampler") || has(name, "upsample") || has(name, "fill_") ||
      has(name, "zero_"))
    return "copy";
  if (has(name, "add") || has(name, "sub") || has(name, "mul") || has(name, "div") ||
      has(name, "relu") || has(name, "silu") || has(name, "gelu") || has(name, "sigmoid") ||
      has(name, "tanh") || has(name, "exp") || has(name, "log") || has(name, "clamp") ||
      has(name, "where") || has(name, "sqrt") || has(name, "pow") || has(name, "sin") ||
      has(name, "cos") || has(name, "neg") || has(name, "masked"))
    return "elementwise";
  return "other";
}

/// The CPU report of profile_by_op_class (profile.h) from the profiler's events.
std::string cpu_report(const torch::autograd::profiler::ProfilerResult& result, int iters,
                       bool launches) {
  // Self time: on each thread, ops nest (an op's children start and end inside it), so a stack
  // of the open ops gives each op its parent, whose self time loses the child's wall time.
  struct Op {
    std::string name;
    uint64_t start, end, thread;
    std::string inputs;  ///< "[1,256,80,80]BFloat16 ..." (the profiler records input shapes)
    double child_ns = 0;
    std::string parents;  ///< the two enclosing ops, outermost first ("aten::to>aten::_to_copy")
  };
  std::vector<Op> ops;
  for (const auto& e : result.events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.isAsync() || e.endNs() < e.startNs()) continue;
    std::string inputs;
    const auto shapes = e.shapes();
    const auto dtypes = e.dtypes();
    for (size_t i = 0; i < shapes.size() && i < 3; ++i) {
      if (shapes[i].empty()) continue;
      inputs += (inputs.empty() ? "[" : " [");
      for (size_t d = 0; d < shapes[i].size(); ++d)
        inputs += (d ? "," : "") + std::to_string(shapes[i][d]);
      inputs += "]" + (i < dtypes.size() ? dtypes[i] : std::string());
    }
    ops.push_back({e.name(), e.startNs(), e.endNs(), e.startThreadId(), inputs});
  }
  std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start != b.start) return a.start < b.start;
    return a.end > b.end;  // the enclosing op first
  });
  std::vector<Op*> open;
  for (auto& op : ops) {
    while (!open.empty() && (open.back()->thread != op.thread || open.back()->end <= op.start))
      open.pop_back();
    if (!open.empty()) open.back()->child_ns += static_cast<double>(op.end - op.start);
    for (size_t i = open.size() > 2 ? open.size() - 2 : 0; i < open.size(); ++i)
      op.parents += (op.parents.empty() ? "" : ">") + open[i]->name;
    open.push_back(&op);
  }
  std::map<std::string, std::pair<double, int>> by_class;  // ms, ops
  std::map<std::string, std::pair<double, int>> by_op;     // ms, calls
  // "class parents>op inputs": ms, calls (the copy, elementwise, norm_softmax_reduce, conv and
  // gemm sites)
  std::map<std::string, std::pair<double, int>> sites;
  double total = 0;
  for (const auto& op : ops) {
    const double ms = (static_cast<double>(op.end - op.start) - op.child_ns) / 1e6;
    auto& c = by_class[cpu_op_class(op.name)];
    c.first += ms;
    c.second += 1;
    by_op[op.name].first += ms;
    by_op[op.name].second += 1;
    const std::string cls = cpu_op_class(op.name);
    if (cls == "copy" || cls == "elementwise" || cls == "norm_softmax_reduce" || cls == "conv" ||
        cls == "gemm") {
      auto& c = sites[cls + " " + op.parents + ">" + op.name + " " + op.inputs];
      c.first += ms;
      c.second += 1;
    }
    total += ms;
  }
  auto sorted = [](const std::map<std::string, std::pair<double, int>>& m) {
    std::vector<std::pair<std::string, std::pair<double, int>>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    return v;
  };
  std::ostringstream os;
  if (launches) {
    // The leaf ops (those that called no other op) of the first forward, in call order: what a
    // device would launch as kernels, for counting them against a fused graph's.
    std::vector<const Op*> leaves;
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool leaf = i + 1 == ops.size() || ops[i + 1].thread != ops[i].thread ||
                        ops[i + 1].start >= ops[i].end;
      if (leaf && ops[i].thread == ops.front().thread) leaves.push_back(&ops[i]);
    }
    const size_t per_forward = leaves.size() / static_cast<size_t>(iters);
    for (size_t i = 0; i < per_forward; ++i)
      os << "profile launch " << i << " class=" << cpu_op_class(leaves[i]->name)
         << " ops=" << leaves[i]->parents << ">" << leaves[i]->name << " " << leaves[i]->inputs
         << "\n";
  }
  for (const auto& [name, v] : sorted(by_class)) {
    os << "profile class=" << name << " ms_per_forward=" << v.first / iters
       << " share=" << (total > 0 ? 100.0 * v.first / total : 0.0)
       << "% ops_per_forward=" << v.second / iters << "\n";
  }
  os << "profile total_cpu_ms_per_forward=" << total / iters << "\n";
  const auto top = sorted(by_op);
  for (size_t i = 0; i < top.size() && i < 16; ++i) {
    os << "profile op ms_per_forward=" << top[i].second.first / iters
       << " calls_per_forward=" << static_cast<double>(top[i].second.second) / iters
       << " class=" << cpu_op_class(top[i].first) << " name=" << top[i].first.substr(0, 140)
       << "\n";
  }
  // Where the copies, elementwise ops, norms, convolutions and GEMMs come from: the enclosing
  // ops and the input shapes of the costliest (24 copies, 16 of each other class).
  std::map<std::string, int> shown;
  for (const auto& [key, v] : sorted(sites)) {
    const auto space = key.find(' ');
    const std::string cls = key.substr(0, space);
    if (++shown[cls] > (cls == "copy" ? 24 : 16)) continue;
    os << "profile " << (cls == "copy" ? "copy" : "site class=" + cls)
       << " ms_per_forward=" << v.first / iters
       << " calls_per_forward=" << static_cast<double>(v.second) / iters
       << " at=" << key.substr(space + 1, 260) << "\n";
  }
  return os.str();
}

}  // namespace

std::string profile_by_op_class(const std::function<void()>& forward, int iters, bool launches) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  // Input shapes recorded for the CPU report's copy sources (they cost the profiled run a little).
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  for (int i = 0; i < iters; ++i) forward();
  const auto result = prof::disableProfiler();
  std::map<std::string, std::pair<double, int>> by_class;   // ms, kernels
  std::map<std::string, std::pair<double, int>> by_kernel;  // ms, launches
  double total = 0;
  // CPU ops by correlation id, and per thread by start time, for the launching op chains.
  std::map<uint64_t, CpuOp> cpu_ops;
  std::map<uint64_t, std::vector<const CpuOp*>> ops_by_thread;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.correlationId() == 0) continue;
    cpu_ops[e.correlationId()] = {e.name(), e.startNs(), e.endNs(), e.startThreadId()};
  }
  for (const auto& [id, op] : cpu_ops) ops_by_thread[op.thread].push_back(&op);
  for (auto& [thread, ops] : ops_by_thread)
    std::sort(ops.begin(), ops.end(), [](const CpuOp* a, const CpuOp* b) {
      return a->start != b->start ? a->start < b->start : a->end > b->end;
    });
  std::map<std::string, std::pair<double, int>> by_chain;  // "class kernel <- chain": ms, launches
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    const std::string name = e.name();
    auto& c = by_class[op_class(name)];
    c.first += ms;
    c.second += 1;
    by_kernel[name].first += ms;
    by_kernel[name].second += 1;
    total += ms;
    const std::string cls = op_class(name);
    if (cls == "copy" || cls == "elementwise") {
      auto it = cpu_ops.find(e.linkedCorrelationId());
      const std::string chain =
          it == cpu_ops.end() ? "?" : op_chain(it->second, ops_by_thread[it->second.thread], 6);
      auto& b = by_chain[cls + " " + chain];
      b.first += ms;
      b.second += 1;
    }
  }
  if (by_kernel.empty()) return cpu_report(*result, iters, launches);
  std::vector<std::pair<std::string, std::pair<double, int>>> classes(by_class.begin(),
                                                                      by_class.end());
  std::sort(classes.begin(), classes.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::ostringstream os;
  if (launches) {
    // The first forward's kernels in launch order with the ops that launched them.
    std::vector<std::pair<uint64_t, std::string>> seq;
    for (const auto& e : result->events()) {
      if (e.deviceType() != c10::DeviceType::CUDA) continue;
      auto it = cpu_ops.find(e.linkedCorrelationId());
      const std::string chain =
          it == cpu_ops.end() ? "?" : op_chain(it->second, ops_by_thread[it->second.thread], 4);
      seq.emplace_back(e.startNs(), "class=" + op_class(e.name()) + " ops=" + chain +
                                        " name=" + std::string(e.name()).substr(0, 90));
    }
    std::sort(seq.begin(), seq.end());
    const size_t per_forward = seq.size() / static_cast<size_t>(iters);
    for (size_t i = 0; i < per_forward; ++i)
      os << "profile launch " << i << " " << seq[i].second << "\n";
  }
  for (const auto& [name, v] : classes) {
    os << "profile class=" << name << " ms_per_forward=" << v.first / iters
       << " share=" << (total > 0 ? 100.0 * v.first / total : 0.0)
       << "% kernels_per_forward=" << v.second / iters << "\n";
  }
  os << "profile total_gpu_ms_per_forward=" << total / iters << "\n";
  std::vector<std::pair<std::string, std::pair<double, int>>> kernels(by_kernel.begin(),
                                                                      by_kernel.end());
  std::sort(kernels.begin(), kernels.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (size_t i = 0; i < kernels.size() && i < 12; ++i) {
    os << "profile kernel ms_per_forward=" << kernels[i].second.first / iters
       << " class=" << op_class(kernels[i].first) << " name=" << kernels[i].first.substr(0, 140)
       << "\n";
  }
  // The classes the next speed steps look at (the copies and elementwise chains left with
  // layouts on): their 8 largest kernels, with launches per forward.
  for (const char* cls : {"copy", "elementwise", "other"}) {
    int shown = 0;
    for (const auto& [name, v] : kernels) {
      if (op_class(name) != cls) continue;
      os << "profile class_kernel class=" << cls << " ms_per_forward=" << v.first / iters
         << " launches_per_forward=" << static_cast<double>(v.second) / iters
         << " name=" << name.substr(0, 160) << "\n";
      if (++shown == 8) break;
    }
  }
  // Which ops launched the copies and elementwise kernels (the launching op chains above).
  std::vector<std::pair<std::string, std::pair<double, int>>> chains(by_chain.begin(),
                                                                     by_chain.end());
  std::sort(chains.begin(), chains.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (size_t i = 0; i < chains.size() && i < 16; ++i) {
    const auto space = chains[i].first.find(' ');
    os << "profile op_chain class=" << chains[i].first.substr(0, space)
       << " ms_per_forward=" << chains[i].second.first / iters
       << " launches_per_forward=" << static_cast<double>(chains[i].second.second) / iters
       << " ops=" << chains[i].first.substr(space + 1, 300) << "\n";
  }
  return os.str();
}

}  // namespace libreyolo::bench
