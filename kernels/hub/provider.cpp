#include "kernels/hub/provider.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/StringUtil.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <torch/version.h>

#ifdef LIBREYOLO_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "kernels/hub/digest.h"
#include "kernels/hub/fetch.h"
#include "kernels/hub/lock.h"
#include "kernels/hub/metadata.h"
#include "log/log.h"

namespace libreyolo::kernels::hub {
namespace {

/// Process-wide record of op namespaces this provider dlopen()ed, with the SHA-256 of the
/// library: loading a second library into one TORCH_LIBRARY namespace aborts the process
/// (kernel-builder issue #11), loading the same bytes again is a no-op.
std::mutex& libraries_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::string>& loaded_namespaces() {
  static auto* m = new std::map<std::string, std::string>();  // leaked: ops outlive statics
  return *m;
}

std::mutex& builds_mutex() {
  static std::mutex m;
  return m;
}
std::vector<LoadedBuild>& builds() {
  static auto* v = new std::vector<LoadedBuild>();  // leaked, as loaded_namespaces
  return *v;
}

void record_build(const LoadedBuild& b) {
  std::lock_guard<std::mutex> lock(builds_mutex());
  for (const auto& o : builds()) {
    if (o.slot == b.slot && o.repo_id == b.repo_id && o.source == b.source &&
        o.location == b.location)
      return;
  }
  builds().push_back(b);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Sub-directory names of `dir`.
std::vector<std::string> subdirectories(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != ".." && is_directory(dir + "/" + n)) out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

std::string basename(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// dlopen + dispatcher lookup + schema check of `<id>::<binding.op>`.
c10::OperatorHandle open_library(const std::string& path, const std::string& id,
                                 const std::string& backend, const HubBinding& binding) {
  const std::string op_name = id + "::" + binding.op;
  auto& dispatcher = c10::Dispatcher::singleton();
  {
    std::lock_guard<std::mutex> lock(libraries_mutex());
    const std::string digest = sha256_hex_file(path);
    auto it = loaded_namespaces().find(id);
    if (it != loaded_namespaces().end()) {
      if (it->second != digest) {
        throw HubError("namespace",
                       "op namespace " + id + " was already loaded from a different library");
      }
    } else {
      if (dispatcher.findSchema({op_name, ""}).has_value()) {
        throw HubError(
            "namespace",
            "op namespace " + id + " is already registered in this process by another library");
      }
      if (!is_elf(path)) throw HubError("dlopen", path + " is not an ELF shared library");
      // RTLD_NOW: unresolved symbols fail here, not inside a request (our PyModule_Create2
      // stub satisfies builds linked against the Python limited API). RTLD_LOCAL: the
      // library's symbols cannot interpose on the process's.
      void* handle = nullptr;
      try {
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      } catch (const std::exception& e) {  // a static initialiser that throws
        throw HubError("dlopen", path + ": " + e.what());
      }
      if (!handle) {
        const char* err = dlerror();
        throw HubError("dlopen", err ? err : (path + ": unknown dlopen error"));
      }
      loaded_namespaces()[id] = digest;  // the handle stays open for the life of the process
    }
  }
  auto handle = dispatcher.findSchema({op_name, ""});
  if (!handle) {
    throw HubError("schema", basename(path) + " registers no op " + op_name);
  }
  std::string schema = c10::toString(handle->schema());
  const std::string prefix = id + "::";
  if (schema.rfind(prefix, 0) == 0) schema = schema.substr(prefix.size());
  if (schema != binding.schema) {
    throw HubError("schema",
                   op_name + " has schema '" + schema + "', expected '" + binding.schema + "'");
  }
  const auto key = backend == "cuda" ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  if (!handle->hasKernelForDispatchKey(key)) {
    throw HubError("schema", op_name + " has no " + c10::toString(key) + " kernel");
  }
  return *handle;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Fetch, verify and open the first accepted variant whose metadata fits the device.
HubOp load_entry(const Connection& connection, const LockEntry& entry,
                 const std::vector<std::string>& accepted, const SystemInfo& system,
                 const HubBinding& binding) {
  std::vector<std::string> archs_rejected;
  for (const auto& variant : accepted) {
    const auto& locked = entry.variants.at(variant);
    const auto& files = locked.files;
    // An upstream-format variant: its file list is checked against the git_lfs_concat hash
    // first, then every file against the list (LFS SHA-256 or git blob id).
    std::optional<UpstreamVariant> prepared;
    if (locked.upstream()) {
      prepared = prepare_upstream_variant(connection, entry, variant);
      if (!prepared->files.count("metadata.json")) {
        throw HubError("metadata", "build/" + variant + " of " + entry.repo_id + "@" + entry.sha +
                                       " has no metadata.json");
      }
    } else if (!files.count("metadata.json")) {
      throw HubError("unlocked", "build/" + variant + "/metadata.json of " + entry.repo_id +
                                     " is not in kernels.lock");
    }
    const std::string meta_path =
        prepared ? ensure_upstream_file(connection, entry, variant, *prepared, "metadata.json")
                 : ensure_file(connection, entry, variant, "metadata.json");
    KernelMetadata meta;
    try {
      meta = read_metadata(meta_path);
    } catch (const std::exception& e) {
      throw HubError("metadata", e.what());
    }
    if (meta.backend_type != system.backend) {
      log::info("hub: " + entry.repo_id + " variant " + variant +
                " rejected: metadata.json backend " + meta.backend_type + " != " + system.backend);
      archs_rejected.push_back(variant);
      continue;
    }
    if (system.backend == "cuda" && system.compute_capability && !meta.archs.empty()) {
      const auto [major, minor] = *system.compute_capability;
      bool runs = false;
      for (const auto& a : meta.archs) runs = runs || arch_runs_on(a, major, minor);
      if (!runs) {
        log::info("hub: " + entry.repo_id + " variant " + variant +
                  " rejected: metadata.json backend.archs [" + join(meta.archs) +
                  "] has no code for compute capability " + std::to_string(major) + "." +
                  std::to_string(minor));
        archs_rejected.push_back(variant);
        continue;
      }
    }
    // Every file, verified, before anything is loaded.
    std::vector<std::string> names;
    std::string library;
    auto take = [&](const std::string& file) {
      names.push_back(file);
      const std::string base = basename(file);
      if (ends_with(base, ".so") && base.rfind(meta.id + ".", 0) == 0) library = file;
    };
    if (prepared) {
      for (const auto& [file, f] : prepared->files) {
        ensure_upstream_file(connection, entry, variant, *prepared, file);
        take(file);
      }
    } else {
      for (const auto& [file, digest] : files) {
        ensure_file(connection, entry, variant, file);
        take(file);
      }
    }
    const std::string dir =
        variant_cache_dir(connection.cache_dir, entry.repo_id, entry.sha, variant);
    try {
      verify_metadata_digest(meta, dir, names);
    } catch (const std::exception& e) {
      throw HubError("digest", e.what());
    }
    if (library.empty()) {
      throw HubError("metadata", "build/" + variant + " of " + entry.repo_id + " has no library " +
                                     meta.id + ".abi3.so (metadata.json id)");
    }
    return HubOp{open_library(dir + "/" + library, meta.id, system.backend, binding),
                 system.backend, entry.repo_id + "@" + entry.sha + " build/" + variant};
  }
  throw HubError("no_variant", "no build variant of " + entry.repo_id + "@" + entry.sha +
                                   " fits this device (" + system.describe() + ")");
}

// The binding of `entry`'s slot. Throws HubError "unsupported".
const HubBinding& binding_for(const LockEntry& entry, const std::string& lock_path,
                              const ProviderOptions& options) {
  const HubBinding* binding = nullptr;
  std::string supported;
  for (const auto& b : options.bindings) {
    if (b.slot == entry.slot) binding = &b;
    supported += (supported.empty() ? "" : ", ") + b.slot;
  }
  if (!binding) {
    throw HubError("unsupported", "slot '" + entry.slot + "' of " + entry.repo_id + " in " +
                                      lock_path + " has no hub binding (supported: " + supported +
                                      ")");
  }
  return *binding;
}

// Loads a LOCAL_KERNELS variant folder: metadata backend and archs, metadata.json digest when
// present, dlopen, schema.
HubOp load_local_variant(const std::string& repo_id, const std::string& dir,
                         const SystemInfo& system, const HubBinding& binding) {
  const std::string where = "LOCAL_KERNELS " + repo_id + " build " + dir;
  KernelMetadata meta;
  try {
    meta = read_metadata(dir + "/metadata.json");
  } catch (const std::exception& e) {
    throw HubError("metadata", where + ": " + e.what());
  }
  if (meta.backend_type != system.backend) {
    throw HubError("no_variant", where + ": metadata.json backend " + meta.backend_type +
                                     " != " + system.backend);
  }
  if (system.backend == "cuda" && system.compute_capability && !meta.archs.empty()) {
    const auto [major, minor] = *system.compute_capability;
    bool runs = false;
    for (const auto& a : meta.archs) runs = runs || arch_runs_on(a, major, minor);
    if (!runs) {
      throw HubError("no_variant", where + ": metadata.json backend.archs [" + join(meta.archs) +
                                       "] has no code for compute capability " +
                                       std::to_string(major) + "." + std::to_string(minor));
    }
  }
  const std::vector<std::string> names = files_in(dir);
  if (meta.has_digest) {
    try {
      verify_metadata_digest(meta, dir, names);
    } catch (const std::exception& e) {
      throw HubError("digest", where + ": " + e.what());
    }
  } else {
    log::info("hub: " + where + " has no metadata.json digest: loaded unverified");
  }
  std::string library;
  for (const auto& file : names) {
    const std::string base = basename(file);
    if (file == base && ends_with(base, ".so") && base.rfind(meta.id + ".", 0) == 0) {
      library = file;
    }
  }
  if (library.empty()) {
    throw HubError("metadata",
                   where + " has no library " + meta.id + ".abi3.so (metadata.json id)");
  }
  return HubOp{open_library(dir + "/" + library, meta.id, system.backend, binding), system.backend,
               repo_id + " local build " + dir};
}

// The variant folder a LOCAL_KERNELS path means, as huggingface/kernels load.py
// get_local_kernel: the best variant for this process in <path>/ or <path>/build/, else <path>
// itself when it holds a metadata.json. Throws HubError "local".
std::string local_variant_dir(const std::string& repo_id, const std::string& path,
                              const SystemInfo& system) {
  for (const std::string& base : {path, path + "/build"}) {
    const auto selection = select_variants(subdirectories(base), system);
    for (const auto& v : selection.accepted) {
      if (file_exists(base + "/" + v + "/metadata.json")) return base + "/" + v;
    }
  }
  if (file_exists(path + "/metadata.json")) return path;
  throw HubError("local", "LOCAL_KERNELS " + repo_id + "=" + path +
                              ": no kernel build for this process (" + system.describe() + ") in " +
                              path + "/<variant>, " + path +
                              "/build/<variant> or the folder itself");
}

void install_local(Registry& registry, const LockEntry& entry, const std::string& path,
                   const std::string& lock_path, const ProviderOptions& options) {
  const HubBinding bound = binding_for(entry, lock_path, options);
  const SystemInfo system = options.system ? *options.system : detect_system();
  const std::string dir = local_variant_dir(entry.repo_id, path, system);
  log::info("hub: " + entry.repo_id + " is overridden by LOCAL_KERNELS: local build " + dir +
            " (not pinned by " + lock_path + ")");
  const std::string repo_id = entry.repo_id, slot = entry.slot;
  auto state = std::make_shared<LazyHubOp>(
      [repo_id, slot, dir, system, bound]() {
        HubOp op = load_local_variant(repo_id, dir, system, bound);
        record_build({slot, repo_id, "local", dir, ""});
        return op;
      },
      options.capturing ? options.capturing : cuda_graph_capturing);
  if (!state->capturing()) state->load_now();
  bound.install(registry, std::move(state));
}

// One lock entry: refuse, select, load (or defer), register. Throws HubError on refusal.
void install_entry(Registry& registry, const LockEntry& entry, const std::string& lock_path,
                   const ProviderOptions& options) {
  const HubBinding* binding = &binding_for(entry, lock_path, options);
  if (!is_commit(entry.sha)) {
    throw HubError("unpinned", entry.repo_id + " in " + lock_path + " is not pinned: sha '" +
                                   entry.sha + "' is not a 40-hex commit (revision '" +
                                   entry.revision +
                                   "'); pin it with `libreyolo-server kernels lock`");
  }
  if (entry.variants.empty()) {
    throw HubError("unlocked",
                   entry.repo_id + "@" + entry.sha + " in " + lock_path +
                       " lists no variant digests; run `libreyolo-server kernels lock`");
  }
  const SystemInfo system = options.system ? *options.system : detect_system();
  std::vector<std::string> names;
  for (const auto& [name, v] : entry.variants) names.push_back(name);
  const Selection selection = select_variants(names, system);
  for (const auto& [name, why] : selection.rejected) {
    const std::string line = "hub: " + entry.repo_id + " variant " + name + " rejected: " + why;
    if (selection.accepted.empty()) {
      log::info(line);
    } else {
      log::debug(line);
    }
  }
  if (selection.accepted.empty()) {
    throw HubError("no_variant", "no locked build variant of " + entry.repo_id + "@" + entry.sha +
                                     " matches this process (" + system.describe() + "); " +
                                     std::to_string(selection.rejected.size()) +
                                     " rejected, reasons logged above");
  }

  const HubSettings settings = options.settings;
  const std::vector<std::string> accepted = selection.accepted;
  const HubBinding bound = *binding;
  auto state = std::make_shared<LazyHubOp>(
      [settings, entry, accepted, system, bound]() {
        // The whole load (every request, retry and backoff) fits in kernels.hub.timeout_seconds,
        // counted from when it starts.
        HubOp op = load_entry(connection_for(settings), entry, accepted, system, bound);
        record_build(
            {entry.slot, entry.repo_id, "hub", op.description, lock_format_name(entry.format)});
        return op;
      },
      options.capturing ? options.capturing : cuda_graph_capturing);
  if (state->capturing()) {
    log::info("hub: a CUDA graph is being captured: " + entry.repo_id +
              " is loaded at the first call outside the capture");
  } else {
    state->load_now();
  }
  bound.install(registry, std::move(state));
}

void load_provider(Registry& registry, const ProviderOptions& options) {
  const std::string lock_path = lock_file_path(options.settings);
  if (lock_path.empty()) {
    log::info(
        "hub: no configuration file and no kernels.hub.lock_file: no hub kernel is pinned, "
        "nothing loaded");
    return;
  }
  if (!file_exists(lock_path)) {
    if (options.settings.lock_file.value.empty()) {
      // The default place: an operator who never pinned anything is not warned.
      log::info("hub: no " + lock_path + ": no hub kernel is pinned, nothing loaded");
      return;
    }
    registry.record_event("*", kProviderName,
                          "unlocked: lock file " + lock_path +
                              " does not exist; create it with `libreyolo-server kernels lock`");
    return;
  }
  std::map<std::string, std::string> local;
  try {
    const char* env = std::getenv("LOCAL_KERNELS");
    local = parse_local_kernels(options.local_kernels ? *options.local_kernels
                                                      : std::string(env ? env : ""));
  } catch (const std::exception& e) {
    // An override the operator asked for and that cannot be read: nothing is loaded (neither
    // the local builds nor the pinned Hub ones); the slots fall back.
    registry.record_event("*", kProviderName, std::string("local: ") + e.what());
    return;
  }
  std::vector<LockEntry> entries;
  try {
    entries = read_lock_file(lock_path);
  } catch (const std::exception& e) {
    registry.record_event("*", kProviderName, std::string("lock: ") + e.what());
    return;
  }
  for (const auto& entry : entries) {
    try {
      auto override = local.find(entry.repo_id);
      if (override != local.end()) {
        const std::string path = override->second;
        local.erase(override);
        install_local(registry, entry, path, lock_path, options);
      } else {
        install_entry(registry, entry, lock_path, options);
      }
    } catch (const std::exception& e) {
      registry.record_event(entry.slot, kProviderName, e.what());
    }
  }
  for (const auto& [repo_id, path] : local) {
    log::warn("hub: LOCAL_KERNELS names " + repo_id + ", which " + lock_path +
              " does not list: not loaded (kernels.lock says which slot a repository fills)");
  }
}

}  // namespace

bool cuda_graph_capturing() {
#ifdef LIBREYOLO_WITH_CUDA
  if (!at::hasCUDA()) return false;
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

SystemInfo detect_system() {
  SystemInfo s;
  s.torch_major = TORCH_VERSION_MAJOR;
  s.torch_minor = TORCH_VERSION_MINOR;
#if defined(_GLIBCXX_USE_CXX11_ABI)
  s.cxx11_abi = _GLIBCXX_USE_CXX11_ABI != 0;
#endif
  struct utsname u {};
  if (::uname(&u) == 0) {
    s.cpu = u.machine;
    if (s.cpu == "arm64") s.cpu = "aarch64";
    if (s.cpu == "AMD64") s.cpu = "x86_64";
  }
#if defined(__linux__)
  s.os = "linux";
#elif defined(__APPLE__)
  s.os = "darwin";
#endif
  if (at::hasCUDA()) {
    s.backend = "cuda";
    const long v = at::detail::getCUDAHooks().versionCUDART();  // e.g. 12080 = 12.8
    s.cuda_major = static_cast<int>(v / 1000);
    s.cuda_minor = static_cast<int>((v % 1000) / 10);
#ifdef LIBREYOLO_WITH_CUDA
    const auto* props = at::cuda::getCurrentDeviceProperties();
    s.compute_capability = std::make_pair(props->major, props->minor);
#endif
  }
  return s;
}

std::shared_ptr<const HubOp> LazyHubOp::load_now() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto op = std::atomic_load(&loaded_)) return op;
  if (!load_error_.empty()) throw std::runtime_error(load_error_);
  try {
    auto op = std::make_shared<const HubOp>(load_());
    std::atomic_store(&loaded_, op);
    log::info("hub: loaded " + op->description);
    return op;
  } catch (const std::exception& e) {
    load_error_ = e.what();
    throw;
  }
}

namespace {

class HubProvider : public Provider {
 public:
  explicit HubProvider(ProviderOptions options) : options_(std::move(options)) {
    if (options_.bindings.empty()) options_.bindings = builtin_bindings();
  }
  std::string name() const override { return kProviderName; }
  void load(Registry& registry) override {
    load_provider(registry, options_);  // never throws: every failure is one event
  }

 private:
  ProviderOptions options_;
};

}  // namespace

std::vector<LoadedBuild> loaded_builds() {
  std::lock_guard<std::mutex> lock(builds_mutex());
  return builds();
}

std::shared_ptr<Provider> make_provider(ProviderOptions options) {
  return std::make_shared<HubProvider>(std::move(options));
}

}  // namespace libreyolo::kernels::hub
