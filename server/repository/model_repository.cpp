#include "server/repository/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace libreyolo::server {

namespace fs = std::filesystem;

ModelRepository::ModelRepository(std::string root, std::string origin)
    : root_(std::move(root)), origin_(std::move(origin)) {}

ModelSource ModelRepository::source(const std::string& name, const std::string& folder) const {
  ModelSource s;
  s.name = name;
  s.serving_yaml = (fs::path(folder) / "serving.yaml").string();
  const std::int64_t best = highest_version(folder);
  if (best < 0) {
    s.error = folder + ": no numeric version folder (<model>/<N>/config.json)";
  } else {
    s.version = std::to_string(best);
    s.dir = (fs::path(folder) / s.version).string();
  }
  return s;
}

std::vector<ModelSource> ModelRepository::scan() const {
  std::error_code ec;
  if (!fs::is_directory(root_, ec))
    throw std::runtime_error("model_repository " + root_ + " (" + origin_ + "): not a directory");
  std::vector<fs::path> dirs;
  for (const auto& d : fs::directory_iterator(root_, ec)) {
    if (d.is_directory() && d.path().filename().string()[0] != '.') dirs.push_back(d.path());
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<ModelSource> out;
  for (const auto& d : dirs) out.push_back(source(d.filename().string(), d.string()));
  return out;
}

ModelSource ModelRepository::locate(const std::string& name) const {
  return source(name, model_folder(root_, name));
}

}  // namespace libreyolo::server
