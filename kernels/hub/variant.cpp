#include "kernels/hub/variant.h"

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace libreyolo::kernels::hub {
namespace {

// "<M><m>" with one digit of major and the rest minor (torch213 = 2.13, abi211 = 2.11).
bool split_version(const std::string& digits, int& major, int& minor) {
  if (digits.size() < 2) return false;
  major = digits[0] - '0';
  minor = std::stoi(digits.substr(1));
  return true;
}

// Backend tag -> (backend, major, minor). CUDA's regex is greedy on the major, as upstream:
// cu126 = 12.6, cu130 = 13.0, cu118 = 11.8.
bool parse_backend(const std::string& tag, Variant& v) {
  static const std::regex versioned(R"(^(cu|rocm|xpu|cann)(\d+)(\d)$)");
  static const std::set<std::string> plain = {"cpu", "metal", "neuron", "tpu"};
  std::smatch m;
  v.backend_tag = tag;
  if (plain.count(tag)) {
    v.backend = tag;
    return true;
  }
  if (!std::regex_match(tag, m, versioned)) return false;
  const std::string family = m[1];
  v.backend = family == "cu" ? "cuda" : family;
  v.backend_major = std::stoi(m[2]);
  v.backend_minor = std::stoi(m[3]);
  return true;
}

std::optional<Variant> parse_variant_name(const std::string& name);

}  // namespace

std::string SystemInfo::describe() const {
  std::ostringstream os_;
  os_ << "torch " << torch_major << "." << torch_minor << (cxx11_abi ? " cxx11 " : " cxx98 ");
  if (backend == "cuda") {
    os_ << "cu" << cuda_major << cuda_minor;
  } else {
    os_ << backend;
  }
  if (compute_capability) {
    os_ << " sm_" << compute_capability->first << compute_capability->second;
  }
  os_ << " " << cpu << "-" << os;
  return os_.str();
}

std::optional<Variant> parse_variant(const std::string& name) {
  // Longer names are no variant name (upstream's longest is ~45 characters). The bound keeps
  // libstdc++'s std::regex, which recurses once per character, off a 100,000-character name
  // from a kernels.lock (a stack overflow: hub_lock_fuzz,
  // tests/fuzz/corpus/hub_lock/regress-long-variant.lock).
  if (name.size() > kMaxVariantNameLength) return std::nullopt;
  try {
    return parse_variant_name(name);
  } catch (const std::out_of_range&) {
    // std::stoi on a version or backend number beyond int (regress-variant-digits.lock).
    return std::nullopt;
  }
}

namespace {

std::optional<Variant> parse_variant_name(const std::string& name) {
  static const std::regex torch_re(
      R"(^torch(\d)(\d+)(?:-(cxx11|cxx98))?-([a-z]+\d*)-([a-z0-9_]+)-([a-z]+)$)");
  static const std::regex stable_re(
      R"(^torch-stable-abi(\d)(\d+)-([a-z]+\d*)-([a-z0-9_]+)-([a-z]+)$)");
  static const std::regex tvm_re(R"(^tvm-ffi(\d+?)(\d+)-([a-z]+\d*)-([a-z0-9_]+)-([a-z]+)$)");
  static const std::regex noarch_re(R"(^torch-([a-z]+)$)");
  Variant v;
  v.name = name;
  std::smatch m;
  if (std::regex_match(name, m, stable_re)) {
    v.kind = Variant::Kind::stable_abi;
    if (!split_version(std::string(m[1]) + std::string(m[2]), v.major, v.minor))
      return std::nullopt;
    if (!parse_backend(m[3], v)) return std::nullopt;
    v.cpu = m[4];
    v.os = m[5];
    return v;
  }
  if (std::regex_match(name, m, tvm_re)) {
    v.kind = Variant::Kind::tvm_ffi;
    v.major = std::stoi(m[1]);
    v.minor = std::stoi(m[2]);
    if (!parse_backend(m[3], v)) return std::nullopt;
    v.cpu = m[4];
    v.os = m[5];
    return v;
  }
  if (std::regex_match(name, m, torch_re)) {
    v.kind = Variant::Kind::torch;
    v.major = std::stoi(m[1]);
    v.minor = std::stoi(m[2]);
    if (m[3].matched) v.cxx11 = (m[3] == "cxx11");
    if (!parse_backend(m[4], v)) return std::nullopt;
    v.cpu = m[5];
    v.os = m[6];
    return v;
  }
  if (std::regex_match(name, m, noarch_re)) {
    v.kind = m[1] == "universal" ? Variant::Kind::universal : Variant::Kind::noarch;
    v.backend = m[1];
    return v;
  }
  return std::nullopt;
}

}  // namespace

Selection select_variants(const std::vector<std::string>& names, const SystemInfo& sys) {
  Selection out;
  std::vector<Variant> ok;
  for (const auto& name : names) {
    auto parsed = parse_variant(name);
    auto reject = [&](const std::string& why) { out.rejected.emplace_back(name, why); };
    if (!parsed) {
      reject("not a variant name (torch<M><m>-cxx11-<backend>-<cpu>-<os> or torch-stable-abi...)");
      continue;
    }
    const Variant& v = *parsed;
    if (v.kind == Variant::Kind::noarch || v.kind == Variant::Kind::universal) {
      reject("pure-Python variant: needs the Python runtime");
      continue;
    }
    if (v.kind == Variant::Kind::tvm_ffi) {
      reject("tvm-ffi variant: needs the tvm-ffi runtime");
      continue;
    }
    if (v.cpu != sys.cpu) {
      reject("CPU " + v.cpu + " != " + sys.cpu);
      continue;
    }
    if (v.os != sys.os) {
      reject("OS " + v.os + " != " + sys.os);
      continue;
    }
    const std::string runtime =
        std::to_string(sys.torch_major) + "." + std::to_string(sys.torch_minor);
    const std::string wanted = std::to_string(v.major) + "." + std::to_string(v.minor);
    if (v.kind == Variant::Kind::torch) {
      if (v.major != sys.torch_major || v.minor != sys.torch_minor) {
        reject("Torch " + wanted + " != " + runtime);
        continue;
      }
      if (v.cxx11 && *v.cxx11 != sys.cxx11_abi) {
        reject(std::string("C++ ABI ") + (*v.cxx11 ? "cxx11" : "cxx98") +
               " != " + (sys.cxx11_abi ? "cxx11" : "cxx98"));
        continue;
      }
    } else if (std::make_pair(v.major, v.minor) >
               std::make_pair(sys.torch_major, sys.torch_minor)) {
      reject("stable ABI " + wanted + " needs Torch >= " + wanted + ", runtime " + runtime);
      continue;
    }
    if (v.backend != sys.backend) {
      reject("backend " + v.backend_tag + " != " + sys.backend);
      continue;
    }
    if (v.backend == "cuda") {
      if (v.backend_major != sys.cuda_major) {
        reject("CUDA " + std::to_string(v.backend_major) + "." + std::to_string(v.backend_minor) +
               ": major != runtime CUDA " + std::to_string(sys.cuda_major) + "." +
               std::to_string(sys.cuda_minor));
        continue;
      }
      if (v.backend_minor > sys.cuda_minor) {
        reject("CUDA " + std::to_string(v.backend_major) + "." + std::to_string(v.backend_minor) +
               " > runtime CUDA " + std::to_string(sys.cuda_major) + "." +
               std::to_string(sys.cuda_minor));
        continue;
      }
    }
    ok.push_back(v);
  }
  // Preference (variants.py::_sort_variants): stable ABI first, highest ABI version first; then
  // classic Torch, untagged before tagged; within a group the highest backend minor first.
  auto key = [](const Variant& v) {
    const int group = v.kind == Variant::Kind::stable_abi ? 0 : 1;
    const int abi = v.kind == Variant::Kind::stable_abi ? -(v.major * 1000 + v.minor) : 0;
    const int tagged = v.cxx11 ? 1 : 0;
    return std::make_tuple(group, abi, tagged, -v.backend_minor, v.name);
  };
  std::stable_sort(ok.begin(), ok.end(),
                   [&](const Variant& a, const Variant& b) { return key(a) < key(b); });
  for (const auto& v : ok) out.accepted.push_back(v.name);
  return out;
}

bool arch_runs_on(const std::string& arch, int major, int minor) {
  static const std::regex re(R"(^(\d+)\.(\d+)(a|f)?(\+PTX)?$)");
  std::smatch m;
  if (!std::regex_match(arch, m, re)) return false;
  const int a_major = std::stoi(m[1]);
  const int a_minor = std::stoi(m[2]);
  // sm_90a: that capability only; sm_100f (family): like SASS, same major.
  if (m[3] == "a") return a_major == major && a_minor == minor;
  if (m[4].matched) return std::make_pair(a_major, a_minor) <= std::make_pair(major, minor);
  return a_major == major && a_minor <= minor;
}

}  // namespace libreyolo::kernels::hub
