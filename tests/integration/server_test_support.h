// Helpers of the daemon's integration tests: a fake detector (deterministic outputs, records
// its batch sizes, can be slowed down), temporary model repositories, free loopback ports and
// a minimal HTTP GET. The gRPC side is reached only through server/grpc/client.h (generated
// protobuf code must not meet torch's headers in one translation unit).
#pragma once

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "models/model.h"
#include "server/config/config.h"

namespace libreyolo::server::testing {

namespace fs = std::filesystem;

/// Shared, observable state of every FakeDetector of the process.
struct FakeState {
  std::mutex mu;
  std::vector<int64_t> batch_sizes;    ///< one entry per forward
  std::vector<double> pixel_sums;      ///< one entry per forward: the sum of its pixel_values
  std::vector<std::string> instances;  ///< LoadOptions::instance of each forward
  std::atomic<int> sleep_ms{0};        ///< per forward
  /// Forwards of the instance with this LoadOptions::instance throw c10::OutOfMemoryError (a
  /// device failure: the batcher takes the instance out of rotation). "*": every instance.
  std::string fail_instance;
  /// Forwards entered (failing ones included, not those whose in_forward threw); `changed` is
  /// notified at each.
  std::size_t entered = 0;
  std::condition_variable changed;
  /// While true, a forward that entered (and did not fail) waits: a test keeps a batch in
  /// flight for as long as it needs, with no timer (HeldForwards).
  bool held = false;
  /// Called by every forward before it records anything (outside `mu`): a test's kernel call.
  std::function<void()> in_forward;
  void reset() {
    std::lock_guard<std::mutex> lk(mu);
    batch_sizes.clear();
    pixel_sums.clear();
    instances.clear();
    fail_instance.clear();
    sleep_ms = 0;
    entered = 0;
    held = false;
    in_forward = nullptr;
    changed.notify_all();
  }
  /// Waits until `n` forwards have entered; false after 60 s (a hung server fails the test
  /// instead of hanging it; no test expects to wait that long).
  bool wait_entered(std::size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    return changed.wait_for(lk, std::chrono::seconds(60), [&] { return entered >= n; });
  }
  void hold(bool on) {
    std::lock_guard<std::mutex> lk(mu);
    held = on;
    changed.notify_all();
  }
  std::vector<double> sums() {
    std::lock_guard<std::mutex> lk(mu);
    return pixel_sums;
  }
  std::vector<int64_t> batches() {
    std::lock_guard<std::mutex> lk(mu);
    return batch_sizes;
  }
  static FakeState& get() {
    static FakeState s;
    return s;
  }
};

/// Holds FakeDetector's forwards while alive (FakeState::held): released on every way out of a
/// test, so that a failed assertion cannot leave a forward waiting forever.
struct HeldForwards {
  HeldForwards() { FakeState::get().hold(true); }
  ~HeldForwards() { release(); }
  void release() { FakeState::get().hold(false); }
};

/// Q = 4 queries, 3 classes. Query q predicts class q % 3 with logit 2 (score sigmoid(2) =
/// 0.8808) and every other class with -4 (score 0.0180); its box is (cx, cy, w, h) =
/// (0.2 q + 0.2, 0.5, 0.1, 0.2) normalised. Outputs do not depend on the pixels.
class FakeDetector : public models::Model {
 public:
  /// What load_model would read of add_fake_model's config.json.
  explicit FakeDetector(models::LoadOptions options = {}) : options_(std::move(options)) {
    description_.model_type = "rt_detr";
    description_.task = models::Task::object_detection;
    description_.num_labels = 3;
    description_.num_queries = 4;
  }
  std::string model_type() const override { return "rt_detr"; }
  models::Task task() const override { return models::Task::object_detection; }
  models::ModelOutput forward(const at::Tensor& pixel_values, const at::Tensor&) const override {
    auto& st = FakeState::get();
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lk(st.mu);
      hook = st.in_forward;
    }
    if (hook) hook();
    {
      // One hold of `mu` from `entered` to the record (or the throw): a test that sees the
      // forward entered sees whether it failed.
      std::unique_lock<std::mutex> lk(st.mu);
      ++st.entered;
      st.changed.notify_all();
      if (!st.fail_instance.empty() &&
          (st.fail_instance == "*" || st.fail_instance == options_.instance))
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (simulated)");
      st.batch_sizes.push_back(pixel_values.size(0));
      st.pixel_sums.push_back(pixel_values.to(at::kDouble).sum().item<double>());
      st.instances.push_back(options_.instance);
      st.changed.wait(lk, [&] { return !st.held; });
    }
    if (int ms = st.sleep_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const int64_t b = pixel_values.size(0);
    auto logits = at::full({b, 4, 3}, -4.0f);
    auto boxes = at::zeros({b, 4, 4});
    for (int64_t q = 0; q < 4; ++q) {
      logits.select(1, q).select(1, q % 3).fill_(2.0f);
      boxes.select(1, q).select(1, 0).fill_(0.2f * q + 0.2f);
      boxes.select(1, q).select(1, 1).fill_(0.5f);
      boxes.select(1, q).select(1, 2).fill_(0.1f);
      boxes.select(1, q).select(1, 3).fill_(0.2f);
    }
    return {logits, boxes};
  }
  const std::map<int64_t, std::string>& id2label() const override { return labels_; }
  const models::LoadOptions& options() const override { return options_; }
  int set_fused_attention(bool) override { return 0; }
  /// No modules: nothing to bind, no layout applies.
  torch::nn::Module& root() override { return root_; }

 private:
  std::map<int64_t, std::string> labels_{{0, "cat"}, {1, "dog"}, {2, "bird"}};
  models::LoadOptions options_;
  torch::nn::Module root_;
};

/// FakeDetector's detections with a mask each: pred_masks (B, 4, 4, 4) where query q's mask
/// logits are +3 in column q and -3 elsewhere, except query 3, whose mask is all -3 (empty:
/// dropped by the post-processing, as upstream drops it).
class FakeSegmenter : public FakeDetector {
 public:
  explicit FakeSegmenter(models::LoadOptions options = {}) : FakeDetector(std::move(options)) {
    description_.model_type = "rf_detr";
    description_.task = models::Task::instance_segmentation;
  }
  std::string model_type() const override { return "rf_detr"; }
  models::Task task() const override { return models::Task::instance_segmentation; }
  models::ModelOutput forward(const at::Tensor& pixel_values,
                              const at::Tensor& mask) const override {
    auto out = FakeDetector::forward(pixel_values, mask);
    out.pred_masks = at::full({pixel_values.size(0), 4, 4, 4}, -3.0f);
    for (int64_t q = 0; q < 3; ++q) out.pred_masks.select(1, q).select(2, q).fill_(3.0f);
    return out;
  }
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

/// A fresh directory under the system temp folder.
inline fs::path temp_dir(const std::string& tag) {
  std::random_device rd;
  auto p = fs::temp_directory_path() /
           ("libreyolo-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  fs::create_directories(p);
  return p;
}

/// Adds <repo>/<name>/1 with a fake checkpoint (config.json says rt_detr; the factory ignores
/// the weights) and the RT-DETR fixture's preprocessor_config.json.
inline void add_fake_model(const fs::path& repo, const std::string& name,
                           const std::string& serving_yaml) {
  const auto dir = repo / name / "1";
  write_file(
      dir / "config.json",
      R"({"model_type": "rt_detr", "num_queries": 4, "id2label": {"0": "cat", "1": "dog", "2": "bird"}})");
  write_file(dir / "preprocessor_config.json",
             read_file(std::string(LIBREYOLO_TEST_FIXTURES) +
                       "/models/rtdetr_tiny/preprocessor_config.json"));
  write_file(dir / "model.safetensors", "");
  if (!serving_yaml.empty()) write_file(repo / name / "serving.yaml", serving_yaml);
}

/// Adds <repo>/rtdetr_tiny/1 from examples/model_repository (random-weight RT-DETR).
inline void add_rtdetr_tiny(const fs::path& repo, const std::string& serving_yaml = "") {
  const fs::path src = fs::path(LIBREYOLO_SOURCE_DIR) / "examples/model_repository/rtdetr_tiny/1";
  const auto dir = repo / "rtdetr_tiny" / "1";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json"}) {
    fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  }
  if (!serving_yaml.empty()) write_file(repo / "rtdetr_tiny" / "serving.yaml", serving_yaml);
}

/// Deletes a directory tree. (Not std::filesystem::remove_all: libtorch.so exports its own copy
/// of it, which the dynamic linker may pick and which crashes.)
inline void remove_tree(const fs::path& dir) {
  ::nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

/// A loopback port that was free a moment ago.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// Waits until something accepts TCP connections on 127.0.0.1:<port>; false after `seconds`.
inline bool wait_port(int port, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

/// A daemon configuration for the in-process tests: `yaml` parsed as the file (hub kernels off),
/// gRPC on 127.0.0.1:0 (the daemon picks a port), the HTTP admin port on a free loopback port,
/// `repo`, `device`, 2 preprocessing threads, 16 MiB messages, and `dtype: float32` unless
/// `yaml` sets it (the fixtures' numbers are float32 ones; `auto` would pick bfloat16 for CPU
/// models on a host with AVX-512 BF16 or AMX, server/instance/dtype_policy.h).
inline ServerConfig loopback_config(const fs::path& repo, const std::string& device = "cpu",
                                    const std::string& yaml = "") {
  ServerConfig c = parse_config(yaml, "test.yaml", {}, {{"LIBREYOLO_HUB_KERNELS", "0"}});
  if (c.dtype.source == Source::default_value) c.dtype.value = "float32";
  c.grpc_address.value = "127.0.0.1:0";
  c.http_address.value = "127.0.0.1:" + std::to_string(free_port());
  c.model_repository.value = repo.string();
  c.device.value = device;
  c.preprocess_threads.value = 2;
  c.max_message_bytes.value = 16 << 20;
  return c;
}

/// The ConfigError parse_config throws for `yaml` read as "bad.yaml" (no environment), or
/// "no error".
inline std::string config_error(const std::string& yaml) {
  try {
    parse_config(yaml, "bad.yaml", {}, {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

/// Loads folders whose path contains "fake" as a FakeDetector, the others with
/// models::load_model.
inline std::function<std::unique_ptr<models::Model>(const std::string&, const models::LoadOptions&)>
fake_or_real() {
  return
      [](const std::string& dir, const models::LoadOptions& o) -> std::unique_ptr<models::Model> {
        if (dir.find("fake") != std::string::npos) return std::make_unique<FakeDetector>(o);
        return models::load_model(dir, o);
      };
}

/// Copies the checkpoint files of tests/fixtures/models/<fixture> to <repo>/<name>/1, with the
/// tokenizer files a Hub folder carries where the fixture has them (BERT's vocab.txt, CLIP's
/// vocab.json + merges.txt or tokenizer.json), and writes <repo>/<name>/serving.yaml.
inline void add_fixture_model(const fs::path& repo, const std::string& name,
                              const std::string& fixture, const std::string& serving_yaml) {
  const fs::path src = fs::path(LIBREYOLO_TEST_FIXTURES) / "models" / fixture;
  const auto dir = repo / name / "1";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json"})
    fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "vocab.txt", "vocab.json", "merges.txt"})
    if (fs::exists(src / f)) fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  write_file(repo / name / "serving.yaml", serving_yaml);
}

/// The value of libreyolo_prompt_cache_<counter>_total (`counter` "hits" or "misses") of
/// instance 0 of `model` on the CPU in the /metrics text `metrics`, or -1 where that series is
/// absent (a model without a prompt cache).
inline long long prompt_cache_count(const std::string& metrics, const std::string& model,
                                    const std::string& counter) {
  const std::string series = "libreyolo_prompt_cache_" + counter +
                             "_total{device=\"cpu\",instance=\"" + model + "_0\",model=\"" + model +
                             "\"} ";
  const auto at = metrics.find(series);
  return at == std::string::npos ? -1 : std::stoll(metrics.substr(at + series.size()));
}

struct HttpReply {
  int status = 0;
  std::string body;
};

/// GET http://127.0.0.1:<port><path> (HTTP/1.0, whole reply read).
inline HttpReply http_get(int port, const std::string& path) {
  HttpReply r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)::write(fd, req.data(), req.size());
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (raw.size() > 12) r.status = std::stoi(raw.substr(9, 3));
  const auto at = raw.find("\r\n\r\n");
  if (at != std::string::npos) r.body = raw.substr(at + 4);
  return r;
}

/// One HTTP exchange read to its end: status, headers (names lower-cased), body.
struct HttpExchange {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  std::string header(const std::string& lower_name) const {
    const auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

/// Sends `method path` HTTP/1.1 with `Connection: close`, `Content-Length` (POST/PUT or a
/// non-empty body) and `extra` header lines ("Name: value"), then reads the reply to EOF.
/// `send_length` false leaves Content-Length out.
inline HttpExchange http_request(int port, const std::string& method, const std::string& path,
                                 const std::string& body = "",
                                 const std::vector<std::string>& extra = {},
                                 bool send_length = true) {
  HttpExchange r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (send_length && (method == "POST" || method == "PUT" || !body.empty()))
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& h : extra) req += h + "\r\n";
  req += "\r\n" + body;
  std::size_t at = 0;
  while (at < req.size()) {
    const ssize_t n = ::send(fd, req.data() + at, req.size() - at, MSG_NOSIGNAL);
    if (n <= 0) break;
    at += static_cast<std::size_t>(n);
  }
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const auto end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  std::size_t line = raw.find("\r\n") + 2;
  while (line < end) {
    const auto eol = raw.find("\r\n", line);
    const auto colon = raw.find(':', line);
    if (colon != std::string::npos && colon < eol) {
      std::string name = raw.substr(line, colon - line);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = raw.substr(colon + 1, eol - colon - 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      r.headers[name] = value;
    }
    line = eol + 2;
  }
  r.body = raw.substr(end + 4);
  return r;
}

/// Little-endian values of a raw output.
template <class T>
std::vector<T> values(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
}

/// A POSIX shared-memory object the test creates (as tritonclient.utils.shared_memory does),
/// mapped here and zeroed; unlinked at the end. Its key: `prefix`, the process id, `tag`.
class PosixShm {
 public:
  PosixShm(const std::string& tag, std::size_t bytes,
           const std::string& prefix = "/libreyolo_test_")
      : key_(prefix + std::to_string(::getpid()) + "_" + tag), bytes_(bytes) {
    ::shm_unlink(key_.c_str());
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
    data_ = static_cast<char*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    std::memset(data_, 0, bytes);
  }
  ~PosixShm() {
    ::munmap(data_, bytes_);
    ::shm_unlink(key_.c_str());
  }
  PosixShm(const PosixShm&) = delete;
  PosixShm& operator=(const PosixShm&) = delete;
  const std::string& key() const { return key_; }
  char* data() { return data_; }

 private:
  std::string key_;
  std::size_t bytes_;
  char* data_ = nullptr;
};

}  // namespace libreyolo::server::testing
