// libFuzzer target: a model.safetensors beyond its header. The input is the whole file, opened
// as the daemon opens a checkpoint (models/core/safetensors.cpp SafetensorsFile::open: mmap,
// header validation), every tensor viewed in its stored dtype and converted to float32 (data
// offsets, dtypes, byte counts), then loaded into a family through its state-dict mapping
// (models::load_model on a folder with the fixture's config.json and this file: the strict
// key/shape mapping of models/core/state_dict.cpp with the family's aliases and ignored keys;
// layouts off). A file with a key starting "model." loads as rtdetr_tiny, any other as
// vit_tiny. Every input either loads or throws std::runtime_error (CheckpointError) naming the
// file; crashes, sanitizer reports and other exceptions are bugs. Seed corpus:
// tests/fuzz/corpus/safetensors_file/ (the two fixtures' checkpoints and corrupted copies).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "models/core/safetensors.h"
#include "models/model.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/torch_support.h"

namespace {

namespace fs = std::filesystem;
using libreyolo::fuzz::fail;

struct Folders {
  std::string vit, rtdetr;
};

const Folders& folders() {
  static const Folders f = [] {
    Folders out;
    for (auto [name, dir] : {std::pair<const char*, std::string*>{"vit_tiny", &out.vit},
                             {"rtdetr_tiny", &out.rtdetr}}) {
      *dir = libreyolo::fuzz::temp_folder(name);
      const std::string src = libreyolo::fuzz::fixtures() + "/models/" + name;
      for (const char* file : {"config.json", "preprocessor_config.json"})
        fs::copy_file(src + "/" + file, *dir + "/" + file);
    }
    return out;
  }();
  return f;
}

void write_all(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot write " + path);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) fail("cannot write " + path);
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  (void)folders();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace libreyolo::models;
  bool rtdetr = false;
  std::string path = folders().vit + "/model.safetensors";
  write_all(path, data, size);
  try {
    const auto file = core::SafetensorsFile::open(path);
    for (const auto& t : file->header().tensors) {
      if (t.key.rfind("model.", 0) == 0) rtdetr = true;
      const at::Tensor v = file->view(t.key);
      if (static_cast<uint64_t>(v.numel()) != t.numel()) fail("view numel of " + t.key);
      if (v.numel() * v.element_size() != static_cast<int64_t>(t.end - t.begin))
        fail("view bytes of " + t.key);
      (void)file->get(t.key, at::kFloat, at::kCPU);
    }
  } catch (const core::CheckpointError& e) {
    libreyolo::fuzz::expect_message(e.what(), path);
    return 0;
  }
  if (rtdetr) {
    const std::string moved = folders().rtdetr + "/model.safetensors";
    fs::rename(path, moved);
    path = moved;
  }
  try {
    LoadOptions options;
    // Layouts off: they transform tensors that loaded (their own parity tests), and folding
    // every checkpoint tripled the time of an execution.
    options.layouts.mode.value = libreyolo::kernels::LayoutMode::off;
    (void)load_model(fs::path(path).parent_path().string(), options);
  } catch (const core::CheckpointError& e) {
    libreyolo::fuzz::expect_message(e.what(), path);
  }
  return 0;
}
