// A loopback HTTP/1.1 server with the Hugging Face Hub's URL scheme for kernel repositories,
// serving folders of the local disk, logging every request (hub provider tests).
//   GET /api/kernels/<org>/<name>/revision/<rev>  -> {"id": repo, "sha": commit}
//   GET /api/kernels/<org>/<name>/refs             -> {"branches": [{name, ref, targetCommit}]}
//   GET /api/kernels/<org>/<name>/tree/<rev>/<dir> -> recursive listing: oid (git blob id) for
//                                                     every file, lfs.oid (SHA-256) for *.so
//   GET /kernels/<org>/<name>/resolve/<rev>/<path> -> the file (Range: bytes=N- honoured)
// Model-type repositories (add_model_repo) answer only under /api/models/<org>/<name>: the
// kernels URLs above give 404 "Repository not found" for them, as on the Hub.
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

  /// Serves `root` as a model-type repository (GET /api/models/<repo_id> answers; nothing under
  /// /api/kernels or /kernels does).
  void add_model_repo(const std::string& repo_id, const std::string& root, const std::string& sha);

  /// Makes branch `name` of `repo_id` point to `commit` (which then serves the same files).
  void set_branch(const std::string& repo_id, const std::string& name, const std::string& commit);

  /// Serves `content` for `path` of `repo_id` (resolve URLs) while the tree listing still
  /// describes the file on disk: a corrupted download.
  void corrupt(const std::string& repo_id, const std::string& path, const std::string& content);

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
    std::map<std::string, std::string> branches;   ///< name -> commit (set_branch)
    std::map<std::string, std::string> corrupted;  ///< path -> served content
    bool model = false;
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
