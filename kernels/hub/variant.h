// Build variants of a Hugging Face kernels-hub repository (`build/<variant>/`): parsing of the
// directory names and the choice of the variants this process can load.
//
// Grammar and rules follow huggingface/kernels `variants.py` / `backends.py`, restricted to what a
// C++ process without Python can load: arch variants with a Torch ABI (classic or stable).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::kernels::hub {

/// The facts of the running process a variant is matched against.
struct SystemInfo {
  int torch_major = 0;  ///< LibTorch major.minor (TORCH_VERSION_MAJOR/MINOR)
  int torch_minor = 0;
  bool cxx11_abi = true;        ///< _GLIBCXX_USE_CXX11_ABI of LibTorch
  std::string backend = "cpu";  ///< "cpu" | "cuda"
  int cuda_major = 0;           ///< CUDA version LibTorch was built with (backend "cuda")
  int cuda_minor = 0;
  std::string cpu = "x86_64";  ///< "x86_64" | "aarch64"
  std::string os = "linux";    ///< "linux" | "darwin" | "windows"
  /// Compute capability (major, minor) of the current CUDA device, when known.
  std::optional<std::pair<int, int>> compute_capability;

  /// "torch 2.11 cxx11 cu128 x86_64-linux" (log messages).
  std::string describe() const;
};

/// A parsed `build/<variant>` directory name.
struct Variant {
  enum class Kind {
    torch,       ///< torch<M><m>[-cxx11|-cxx98]-<backend>-<cpu>-<os>
    stable_abi,  ///< torch-stable-abi<M><m>-<backend>-<cpu>-<os>
    tvm_ffi,     ///< tvm-ffi<M><m>-<backend>-<cpu>-<os>
    noarch,      ///< torch-<backend>: pure Python
    universal,   ///< torch-universal: legacy pure Python
  };
  Kind kind = Kind::torch;
  std::string name;           ///< the directory name
  int major = 0, minor = 0;   ///< Torch (or stable ABI / tvm-ffi) version
  std::optional<bool> cxx11;  ///< ABI tag: true = cxx11, false = cxx98, none = untagged
  std::string backend;        ///< "cpu", "cuda", "rocm", "xpu", "metal", ... (noarch: its name)
  std::string backend_tag;    ///< as written: "cu126", "rocm71", "cpu"
  int backend_major = 0, backend_minor = 0;  ///< cu126 -> 12, 6 (greedy major, as upstream)
  std::string cpu, os;
};

/// Parses a variant directory name; std::nullopt when it does not follow the grammar, is longer
/// than kMaxVariantNameLength or has a version number beyond int.
std::optional<Variant> parse_variant(const std::string& name);

/// Longest name parse_variant() reads; a longer one is not a variant name.
constexpr std::size_t kMaxVariantNameLength = 256;

/// Outcome of matching a repository's variants against the process.
struct Selection {
  /// Loadable variants, most preferred first: stable ABI (highest ABI first), then classic Torch
  /// (untagged before cxx11-tagged); within a group the highest backend minor first.
  std::vector<std::string> accepted;
  /// (variant, reason) for every other variant, in input order.
  std::vector<std::pair<std::string, std::string>> rejected;
};

/// Applies the upstream rejection rules (CPU, OS, Torch version and ABI tag, stable ABI >= rule,
/// CUDA same major and variant minor <= runtime minor, exact match for other backends) plus this
/// loader's own: pure-Python (noarch, universal) and tvm-ffi variants cannot be loaded.
Selection select_variants(const std::vector<std::string>& names, const SystemInfo& system);

/// True when code built for `arch` (metadata.json `backend.archs` entry: "8.0", "9.0+PTX",
/// "9.0a") runs on a device of compute capability major.minor: SASS runs on the same major with
/// a minor >= its own (also family "f" targets), PTX on any later capability, arch-specific ("a")
/// targets only on their own capability. Unparseable entries never match.
bool arch_runs_on(const std::string& arch, int major, int minor);

}  // namespace libreyolo::kernels::hub
