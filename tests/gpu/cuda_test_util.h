// Helpers of the CUDA kernel tests: a minimal safetensors reader (tests/fixtures/ops) and error
// measures. Header-only; included by tests/gpu/cuda_*_test.cpp.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/dot_product_attention.h"
#include "kernels/attention/ms_deform_attn.h"
#include "kernels/attention/rotary_embedding.h"
#include "kernels/attention/sampling_locations.h"
#include "kernels/box/refine_boxes.h"
#include "kernels/conv/conv2d_bias_act.h"
#include "kernels/gemm/fp8_gemm.h"
#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_act.h"
#include "kernels/image/image_preprocess.h"
#include "kernels/kernels.h"
#include "kernels/norm/add_layer_norm.h"
#include "kernels/pool/max_pool2d.h"
#include "kernels/quant/fake_quant_fp8.h"
#include "kernels/registry.h"
#include "tests/support/tensor_diff.h"

// Weak: without nvcc (CI) libreyolo_kernels lacks it, test_gpu still links, and the tests skip.
namespace libreyolo::kernels {
void register_cuda_kernels(Registry& registry)  // kernels/attention/cuda/register_cuda_kernels.cpp
    __attribute__((weak));
}  // namespace libreyolo::kernels

/// Skips the test without a usable CUDA device, or in a build without the in-tree CUDA kernels.
#define REQUIRE_CUDA()                                                                           \
  if (!at::cuda::is_available()) GTEST_SKIP() << "no CUDA device";                               \
  if (!::libreyolo::kernels::built_with_cuda() || !&::libreyolo::kernels::register_cuda_kernels) \
  GTEST_SKIP() << "built without the CUDA kernels"

namespace libreyolo::test {

/// Every tensor of a safetensors file (F32, F64, I64), as CPU tensors. The format: 8-byte
/// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, raw data.
/// Throws std::runtime_error naming the file on anything unexpected.
inline std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < 8) throw std::runtime_error(path + ": too short");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (8 + n > bytes.size()) throw std::runtime_error(path + ": bad header length");
  const std::string header = bytes.substr(8, n);
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, at::Tensor> out;
  // The header is flat: "name":{"dtype":"F32","shape":[..],"data_offsets":[a,b]}. A scan for
  // "dtype" is enough (the __metadata__ entry has none).
  size_t pos = 0;
  while ((pos = header.find("\"dtype\"", pos)) != std::string::npos) {
    const size_t open = header.rfind('{', pos);
    const size_t name_end = header.rfind('"', open);
    const size_t name_begin = header.rfind('"', name_end - 1);
    const std::string name = header.substr(name_begin + 1, name_end - name_begin - 1);
    const size_t close = header.find('}', pos);
    const std::string entry = header.substr(open, close - open);
    auto field = [&](const std::string& key) {
      const size_t k = entry.find("\"" + key + "\"");
      if (k == std::string::npos) throw std::runtime_error(path + ": " + name + " lacks " + key);
      return entry.substr(entry.find(':', k) + 1);
    };
    auto numbers = [](const std::string& s) {
      std::vector<int64_t> v;
      const size_t b = s.find('['), e = s.find(']');
      std::stringstream ss(s.substr(b + 1, e - b - 1));
      std::string item;
      while (std::getline(ss, item, ','))
        if (item.find_first_not_of(" \t") != std::string::npos) v.push_back(std::stoll(item));
      return v;
    };
    std::string dtype = field("dtype");
    dtype = dtype.substr(dtype.find('"') + 1);
    dtype = dtype.substr(0, dtype.find('"'));
    const auto shape = numbers(field("shape"));
    const auto offsets = numbers(field("data_offsets"));
    at::ScalarType st;
    if (dtype == "F32") {
      st = at::kFloat;
    } else if (dtype == "F64") {
      st = at::kDouble;
    } else if (dtype == "I64") {
      st = at::kLong;
    } else {
      throw std::runtime_error(path + ": " + name + " has unsupported dtype " + dtype);
    }
    auto t = at::empty(shape, at::TensorOptions().dtype(st));
    if (static_cast<int64_t>(offsets.at(1) - offsets.at(0)) != t.nbytes())
      throw std::runtime_error(path + ": " + name + " size does not match its shape");
    std::memcpy(t.data_ptr(), data + offsets[0], t.nbytes());
    out[name] = t;
    pos = close;
  }
  return out;
}

/// Path of a file under tests/fixtures.
inline std::string fixture(const std::string& rel) {
  return std::string(LIBREYOLO_TEST_FIXTURES) + "/" + rel;
}

/// Number of elements whose float32 bit patterns differ (all NaNs count as equal).
inline int64_t bit_mismatches(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.detach().to(at::kCPU).contiguous();
  const auto y = b.detach().to(at::kCPU).contiguous();
  const auto both_nan = at::logical_and(at::isnan(x), at::isnan(y));
  const auto differ = at::ne(x.view(at::kInt), y.view(at::kInt));
  return at::logical_and(differ, at::logical_not(both_nan)).sum().item<int64_t>();
}

/// The context of a model on cuda:0 (what the cuda implementations bind to).
inline kernels::BindContext cuda_context() {
  kernels::BindContext c;
  c.device = kernels::BindContext::Device::cuda;
  c.device_index = 0;
  return c;
}

/// Declares the built-in slots in `reg` and registers only the `cuda` implementations (no
/// references: a decline then shows as std::nullopt).
inline void declare_with_cuda_only(kernels::Registry& reg) {
  reg.declare(kernels::kMsDeformAttn);
  reg.declare(kernels::kSamplingLocations);
  reg.declare(kernels::kRefineBoxes);
  reg.declare(kernels::kRotaryEmbedding);
  reg.declare(kernels::kFakeQuantFp8);
  reg.declare(kernels::kConv2dBiasAct);
  reg.declare(kernels::kMaxPool2d);
  reg.declare(kernels::kAddLayerNorm);
  reg.declare(kernels::kAttention);
  reg.declare(kernels::kLinearAct);
  reg.declare(kernels::kLinear);
  reg.declare(kernels::kFp8Gemm);
  reg.declare(kernels::kImagePreprocess);
  kernels::register_cuda_kernels(reg);
}

/// One process-wide registry made by declare_with_cuda_only.
inline kernels::Registry& cuda_only() {
  static kernels::Registry* r = [] {
    auto* reg = new kernels::Registry();
    declare_with_cuda_only(*reg);
    return reg;
  }();
  return *r;
}

/// `impl`'s record for `slot` in `reg`'s report (calls, declines by reason, disabled); an empty
/// record when the slot does not list it.
inline kernels::CandidateReport candidate_report(kernels::Registry& reg, const std::string& slot,
                                                 const std::string& impl) {
  for (const auto& s : reg.report())
    if (s.slot == slot)
      for (const auto& c : s.candidates)
        if (c.name == impl) return c;
  return {};
}

/// `impl` of `slot` was called `calls` times and declined as often as `declines` says per reason.
inline void expect_calls_and_declines(kernels::Registry& reg, const std::string& slot,
                                      const std::string& impl, uint64_t calls,
                                      const std::map<std::string, uint64_t>& declines) {
  auto record = candidate_report(reg, slot, impl);
  EXPECT_EQ(record.calls, calls);
  for (const auto& [reason, n] : declines) EXPECT_EQ(record.declined[reason], n) << reason;
}

}  // namespace libreyolo::test
