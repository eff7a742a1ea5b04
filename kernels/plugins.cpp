// The `plugins` provider: out-of-tree implementations in shared libraries.
#include <dlfcn.h>

#include "kernels/kernels.h"
#include "log/log.h"

namespace libreyolo::kernels {
namespace {

/// The plugin ABI: what a plugin library exports (kernels/kernels.h make_plugins_provider).
using RegisterFn = void (*)(Registry&);
constexpr const char* kRegisterSymbol = "libreyolo_register_kernels";

class PluginsProvider : public Provider {
 public:
  explicit PluginsProvider(std::string paths) : paths_(std::move(paths)) {}
  std::string name() const override { return "plugins"; }
  void load(Registry& registry) override {
    size_t start = 0;
    while (start <= paths_.size()) {
      size_t end = paths_.find(':', start);
      if (end == std::string::npos) end = paths_.size();
      const std::string path = paths_.substr(start, end - start);
      start = end + 1;
      if (!path.empty()) load_one(registry, path);
    }
  }

 private:
  static void load_one(Registry& registry, const std::string& path) {
    // RTLD_NOW: unresolved symbols fail here, not in the middle of a request.
    // RTLD_LOCAL: a plugin's own symbols cannot interpose on ours.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      registry.record_event("*", "plugin:" + path,
                            std::string("plugin not loaded: ") + (err ? err : "unknown error"));
      return;
    }
    auto fn = reinterpret_cast<RegisterFn>(dlsym(handle, kRegisterSymbol));
    if (!fn) {
      registry.record_event("*", "plugin:" + path,
                            std::string("plugin not loaded: no extern \"C\" ") + kRegisterSymbol);
      dlclose(handle);
      return;
    }
    try {
      fn(registry);
    } catch (const std::exception& e) {
      registry.record_event("*", "plugin:" + path, std::string("plugin failed: ") + e.what());
      return;  // the library stays open: it may have registered some implementations
    }
    log::info("loaded kernel plugin " + path);
    // The handle stays open for the life of the process: its implementations are registered.
  }

  std::string paths_;
};

}  // namespace

std::shared_ptr<Provider> make_plugins_provider(std::string paths) {
  return std::make_shared<PluginsProvider>(std::move(paths));
}

}  // namespace libreyolo::kernels
