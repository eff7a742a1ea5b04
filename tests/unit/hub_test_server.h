// A loopback HTTP/1.1 server with the Hugging Face Hub's URL scheme for kernel repositories,
// serving folders of the local disk, logging every request (hub provider tests).
//   GET /api/kernels/<org>/<name>/revision/<rev>  -> {"id": repo, "sha": commit}
//   GET /api/kernels/<org>/<name>/tree/<rev>/build -> recursive listing (lfs.oid for *.so)
//   GET /kernels/<org>/<name>/resolve/<rev>/<path> -> the file (Range: bytes=N- honoured)
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace libreyolo::test {

class HubTestServer {
 public:
  /// normal answers at once; slow reads the request, logs it and never answers (until stop).
  enum class Mode { normal, slow };

  explicit HubTestServer(Mode mode = Mode::normal);
  ~HubTestServer();
  HubTestServer(const HubTestServer&) = delete;
  HubTestServer& operator=(const HubTestServer&) = delete;

  /// Serves `root` (a folder holding build/) as repository `repo_id` at commit `sha`; the
  /// revisions in `refs` (e.g. "v1") resolve to `sha` too.
  void add_repo(const std::string& repo_id, const std::string& root, const std::string& sha,
                const std::vector<std::string>& refs = {"v1"});

  /// "http://127.0.0.1:<port>"
  std::string endpoint() const;

  /// Every request so far: "GET <target>" (plus " range=<value>" when a Range header came).
  std::vector<std::string> requests() const;
  /// Authorization header values received, in order ("" when absent).
  std::vector<std::string> authorizations() const;
  /// Forgets the logged requests.
  void clear();
  void stop();

  /// A loopback port nothing listens on (connection refused).
  static int unused_port();

 private:
  void serve();
  void handle(int fd);

  struct Repo {
    std::string root, sha;
    std::vector<std::string> refs;
  };
  Mode mode_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, Repo> repos_;
  std::vector<std::string> requests_;
  std::vector<std::string> authorizations_;
};

}  // namespace libreyolo::test
