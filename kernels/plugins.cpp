#include <dlfcn.h>

#include "kernels/kernels.h"
#include "log/log.h"

namespace libreyolo::kernels {

int load_plugins(Registry& registry, const std::string& paths) {
  int loaded = 0;
  size_t start = 0;
  while (start <= paths.size()) {
    size_t end = paths.find(':', start);
    if (end == std::string::npos) end = paths.size();
    const std::string path = paths.substr(start, end - start);
    start = end + 1;
    if (path.empty()) continue;
    // RTLD_NOW: unresolved symbols fail here, not in the middle of a request.
    // RTLD_LOCAL: a plugin's own symbols cannot interpose on ours.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      registry.record_event("*", "plugin:" + path,
                            std::string("plugin not loaded: ") + (err ? err : "unknown error"));
      continue;
    }
    log::info("loaded kernel plugin " + path);
    ++loaded;  // the handle is kept open for the life of the process on purpose
  }
  return loaded;
}

}  // namespace libreyolo::kernels
