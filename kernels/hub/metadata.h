// build/<variant>/metadata.json of a kernels-hub build (schema: huggingface/kernels
// kernels-data/src/metadata.rs; hf-kernels-hub.md section 1.4) and its optional `digest`.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace libreyolo::kernels::hub {

/// The fields this loader uses (unknown fields are allowed, as upstream).
struct KernelMetadata {
  std::string name;  ///< kernel name, e.g. "deformable-detr"
  std::string id;    ///< Torch ops namespace and library stem, e.g. "_deformable_detr_cuda_1a2b3c4"
  std::string backend_type;        ///< "cuda", "cpu", "rocm", ...
  std::vector<std::string> archs;  ///< backend.archs ("8.0", "9.0+PTX"); may be empty
  bool has_digest = false;
  std::string digest_algorithm;                     ///< "sha256" | "sha512"
  std::map<std::string, std::string> digest_files;  ///< relative path -> base64 digest
};

/// Parses `path`. Throws std::runtime_error naming the file and the key: not JSON, missing
/// `id`/`backend.type`, an `id` that is not a C identifier (it becomes an op namespace).
KernelMetadata read_metadata(const std::string& path);

/// metadata.json's text as read from `path` (read_metadata after reading; the hub fuzz target).
/// Throws std::runtime_error like read_metadata.
KernelMetadata parse_metadata(const std::string& text, const std::string& path);

/// Checks metadata.json's own `digest` the way `kernels verify` does (kernels-data/src/digest.rs):
/// `files` (paths relative to `variant_dir`, metadata.json(.sigstore), *.pyc and __pycache__
/// excluded) must be exactly the listed ones, each with the listed digest. Throws
/// std::runtime_error naming the first missing, unknown or mismatching file.
void verify_metadata_digest(const KernelMetadata& metadata, const std::string& variant_dir,
                            const std::vector<std::string>& files);

}  // namespace libreyolo::kernels::hub
