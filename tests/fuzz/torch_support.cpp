// See torch_support.h.
#include "tests/fuzz/torch_support.h"

#include <ATen/ATen.h>
#include <ftw.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "models/model.h"
#include "tests/integration/server_test_support.h"

namespace libreyolo::fuzz {
namespace {

namespace fs = std::filesystem;

/// 5 classes; class c has logit c - 2 for every image.
class FakeClassifier : public models::Model {
 public:
  /// What load_model would read of a vit config.json with these 5 labels.
  FakeClassifier() {
    description_.model_type = "vit";
    description_.task = models::Task::image_classification;
    description_.num_labels = 5;
  }
  std::string model_type() const override { return "vit"; }
  models::Task task() const override { return models::Task::image_classification; }
  models::ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    const int64_t b = pixel_values.size(0);
    return {at::arange(5, at::kFloat).sub_(2.0).unsqueeze(0).expand({b, 5}).contiguous(), {}};
  }
  const std::map<int64_t, std::string>& id2label() const override { return labels_; }
  const models::LoadOptions& options() const override { return options_; }
  int set_fused_attention(bool) override { return 0; }
  torch::nn::Module& root() override { return root_; }

 private:
  std::map<int64_t, std::string> labels_{{0, "a"}, {1, "b"}, {2, "c"}, {3, "d"}, {4, "e"}};
  models::LoadOptions options_;
  torch::nn::Module root_;
};

std::mutex folders_mu;
std::vector<std::string>& folders() {
  static std::vector<std::string> v;
  return v;
}

void remove_folders() {
  std::lock_guard<std::mutex> lk(folders_mu);
  for (const auto& f : folders()) {
    std::error_code ec;
    fs::remove_all(f, ec);
  }
}

}  // namespace

std::string fixtures() {
  const char* env = std::getenv("LIBREYOLO_FUZZ_FIXTURES");
  return env && *env ? env : LIBREYOLO_TEST_FIXTURES;
}

std::string temp_folder(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/libreyolo-fuzz-" + tag + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  std::lock_guard<std::mutex> lk(folders_mu);
  if (folders().empty()) std::atexit(remove_folders);
  folders().push_back(pattern);
  return pattern;
}

server::ModelFactory fake_models() {
  return [](const std::string& dir, const models::LoadOptions&) -> std::unique_ptr<models::Model> {
    if (dir.find("classifier") != std::string::npos) return std::make_unique<FakeClassifier>();
    if (dir.find("segmenter") != std::string::npos)
      return std::make_unique<server::testing::FakeSegmenter>();
    return std::make_unique<server::testing::FakeDetector>();
  };
}

std::string write_fake_repository() {
  using server::testing::read_file;
  using server::testing::write_file;
  const fs::path repo = temp_folder("repo");
  const std::string models = fixtures() + "/models";
  write_file(
      repo / "fake_detector/1/config.json",
      R"({"model_type": "rt_detr", "num_queries": 4, "id2label": {"0": "cat", "1": "dog", "2": "bird"}})");
  write_file(repo / "fake_detector/1/preprocessor_config.json",
             read_file(models + "/rtdetr_tiny/preprocessor_config.json"));
  write_file(repo / "fake_detector/1/model.safetensors", "");
  for (const char* f : {"config.json", "preprocessor_config.json", "model.safetensors"})
    write_file(repo / "fake_segmenter/1" / f, read_file((repo / "fake_detector/1" / f).string()));
  write_file(
      repo / "fake_classifier/1/config.json",
      R"({"model_type": "vit", "id2label": {"0": "a", "1": "b", "2": "c", "3": "d", "4": "e"}})");
  write_file(repo / "fake_classifier/1/preprocessor_config.json",
             read_file(models + "/vit_tiny/preprocessor_config.json"));
  write_file(repo / "fake_classifier/1/model.safetensors", "");
  return repo.string();
}

}  // namespace libreyolo::fuzz
