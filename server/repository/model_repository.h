// The model repository on disk, as Triton lays it out: <root>/<model>/<N>/ version folders (the
// highest numeric N is served) and an optional <root>/<model>/serving.yaml. Scanning and naming
// only; loading is ModelLifecycle's (server/lifecycle/). No torch in this header.
#pragma once

#include <string>
#include <vector>

#include "server/repository/model_name.h"

namespace libreyolo::server {

/// One model folder as scanned.
struct ModelSource {
  std::string name;          ///< the folder's name
  std::string version;       ///< the highest numeric version folder ("" when there is none)
  std::string dir;           ///< <root>/<name>/<version> ("" when there is none)
  std::string error;         ///< why it cannot load ("" when version was found)
  std::string serving_yaml;  ///< <root>/<name>/serving.yaml (may not exist)
};

class ModelRepository {
 public:
  /// `root`: the model_repository folder; `origin` says where it was configured
  /// ("default", "file config/server.yaml:3:3", "flag --model-repository") for the error.
  ModelRepository(std::string root, std::string origin);

  const std::string& root() const { return root_; }

  /// Every model folder (hidden ones skipped), sorted by name. Throws std::runtime_error
  /// "model_repository DIR (ORIGIN): not a directory" when the root is not a folder: Triton
  /// refuses to start without its repository, so a typo or a failed download does not leave a
  /// daemon that runs but never becomes ready.
  std::vector<ModelSource> scan() const;

  /// One folder, re-scanned (model control's load). Throws api::Error INVALID_ARGUMENT for a
  /// name that is not a plain folder name, NOT_FOUND when the folder does not exist
  /// (model_folder).
  ModelSource locate(const std::string& name) const;

 private:
  ModelSource source(const std::string& name, const std::string& folder) const;

  std::string root_, origin_;
};

}  // namespace libreyolo::server
