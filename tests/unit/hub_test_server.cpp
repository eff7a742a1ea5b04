#include "hub_test_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "kernels/hub/digest.h"

namespace libreyolo::test {
namespace {

void send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

void respond(int fd, int status, const std::string& reason, const std::string& body,
             const std::string& extra_headers = "") {
  std::ostringstream os;
  os << "HTTP/1.1 " << status << " " << reason << "\r\nContent-Length: " << body.size()
     << "\r\nConnection: close\r\n"
     << extra_headers << "\r\n"
     << body;
  send_all(fd, os.str());
}

std::string read_file(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every regular file under root/<rel>, as paths relative to root.
void walk(const std::string& root, const std::string& rel, std::vector<std::string>& files,
          std::vector<std::string>& dirs) {
  DIR* d = ::opendir((root + "/" + rel).c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = rel + "/" + name;
    struct stat st {};
    if (::stat((root + "/" + path).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      dirs.push_back(path);
      walk(root, path, files, dirs);
    } else if (S_ISREG(st.st_mode)) {
      files.push_back(path);
    }
  }
  ::closedir(d);
}

}  // namespace

HubTestServer::HubTestServer(Mode mode) : mode_(mode) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) throw std::runtime_error("socket failed");
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    throw std::runtime_error("bind/listen failed");
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

HubTestServer::~HubTestServer() { stop(); }

void HubTestServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);  // no lost wake-up of a slow handler
    if (stopping_.exchange(true)) return;
  }
  cv_.notify_all();
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (thread_.joinable()) thread_.join();
}

int HubTestServer::unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);  // bound, never listened: connecting is refused
  return ntohs(addr.sin_port);
}

void HubTestServer::add_repo(const std::string& repo_id, const std::string& root,
                             const std::string& sha, const std::vector<std::string>& refs) {
  std::lock_guard<std::mutex> lock(mutex_);
  repos_[repo_id] = {root, sha, refs, {}, {}, false};
}

void HubTestServer::add_model_repo(const std::string& repo_id, const std::string& root,
                                   const std::string& sha) {
  std::lock_guard<std::mutex> lock(mutex_);
  repos_[repo_id] = {root, sha, {"v1"}, {}, {}, true};
}

void HubTestServer::set_branch(const std::string& repo_id, const std::string& name,
                               const std::string& commit) {
  std::lock_guard<std::mutex> lock(mutex_);
  repos_.at(repo_id).branches[name] = commit;
}

void HubTestServer::corrupt(const std::string& repo_id, const std::string& path,
                            const std::string& content) {
  std::lock_guard<std::mutex> lock(mutex_);
  repos_.at(repo_id).corrupted[path] = content;
}

std::string HubTestServer::endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

std::vector<std::string> HubTestServer::requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_;
}

std::vector<std::string> HubTestServer::authorizations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return authorizations_;
}

void HubTestServer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  requests_.clear();
  authorizations_.clear();
}

void HubTestServer::serve() {
  while (!stopping_) {
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (stopping_) return;
      continue;
    }
    handle(fd);
    ::close(fd);
  }
}

void HubTestServer::handle(int fd) {
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  std::istringstream in(req);
  std::string method, target, version, line, range, auth;
  in >> method >> target >> version;
  std::getline(in, line);
  while (std::getline(in, line) && line != "\r") {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), value = line.substr(colon + 1);
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
    while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
    if (key == "range") range = value;
    if (key == "authorization") auth = value;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back(method + " " + target + (range.empty() ? "" : " range=" + range));
    authorizations_.push_back(auth);
  }
  if (mode_ == Mode::slow) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return stopping_.load(); });
    return;
  }
  const std::string path = target.substr(0, target.find('?'));
  // Split "/api/kernels/<org>/<name>/<op>/<rev>/<rest>" or
  // "/kernels/<org>/<name>/resolve/<rev>/<rest>".
  std::vector<std::string> parts;
  for (size_t start = 1; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  // GET /api/models/<org>/<name>: only model-type repositories answer.
  if (parts.size() == 4 && parts[0] == "api" && parts[1] == "models") {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = repos_.find(parts[2] + "/" + parts[3]);
    if (it == repos_.end() || !it->second.model)
      return respond(fd, 404, "Not Found", "{\"error\":\"Repository not found\"}");
    return respond(fd, 200, "OK",
                   nlohmann::json{{"id", it->first}, {"sha", it->second.sha}}.dump());
  }
  // GET /api/kernels/<org>/<name>/refs
  if (parts.size() == 5 && parts[0] == "api" && parts[1] == "kernels" && parts[4] == "refs") {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = repos_.find(parts[2] + "/" + parts[3]);
    if (it == repos_.end() || it->second.model)
      return respond(fd, 404, "Not Found", "{\"error\":\"Repository not found\"}");
    std::map<std::string, std::string> branches;
    for (const auto& r : it->second.refs) branches[r] = it->second.sha;
    for (const auto& [name, commit] : it->second.branches) branches[name] = commit;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [name, commit] : branches)
      list.push_back({{"name", name}, {"ref", "refs/heads/" + name}, {"targetCommit", commit}});
    return respond(fd, 200, "OK",
                   nlohmann::json{{"branches", list},
                                  {"tags", nlohmann::json::array()},
                                  {"converts", nlohmann::json::array()}}
                       .dump());
  }
  const bool api = parts.size() >= 6 && parts[0] == "api" && parts[1] == "kernels";
  const bool file = parts.size() >= 6 && parts[0] == "kernels" && parts[3] == "resolve";
  if (!api && !file) return respond(fd, 404, "Not Found", "{\"error\":\"not found\"}");
  const size_t base = api ? 2 : 1;
  const std::string repo_id = parts[base] + "/" + parts[base + 1];
  const std::string op = parts[base + 2];
  const std::string rev = parts[base + 3];
  std::string rest;
  for (size_t i = base + 4; i < parts.size(); ++i) rest += (rest.empty() ? "" : "/") + parts[i];
  Repo repo;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = repos_.find(repo_id);
    if (it == repos_.end() || it->second.model)
      return respond(fd, 404, "Not Found", "{\"error\":\"Repository not found\"}");
    repo = it->second;
  }
  std::string commit = rev == repo.sha ? repo.sha : "";
  for (const auto& r : repo.refs) {
    if (r == rev) commit = repo.sha;
  }
  for (const auto& [name, c] : repo.branches) {
    if (name == rev || c == rev) commit = c;
  }
  if (commit.empty()) return respond(fd, 404, "Not Found", "{\"error\":\"Invalid rev id\"}");
  if (api && op == "revision") {
    return respond(fd, 200, "OK", nlohmann::json{{"id", repo_id}, {"sha", commit}}.dump());
  }
  if (api && op == "tree") {
    std::vector<std::string> files, dirs;
    walk(repo.root, rest, files, dirs);
    nlohmann::json list = nlohmann::json::array();
    for (const auto& d : dirs) list.push_back({{"type", "directory"}, {"path", d}, {"size", 0}});
    for (const auto& f : files) {
      struct stat st {};
      ::stat((repo.root + "/" + f).c_str(), &st);
      bool ok = false;
      nlohmann::json e = {
          {"type", "file"},
          {"path", f},
          {"size", st.st_size},
          {"oid", kernels::hub::git_blob_sha1_hex(read_file(repo.root + "/" + f, ok))}};
      if (f.size() > 3 && f.compare(f.size() - 3, 3, ".so") == 0) {
        e["lfs"] = {{"oid", kernels::hub::sha256_hex_file(repo.root + "/" + f)},
                    {"size", st.st_size}};
      }
      list.push_back(e);
    }
    return respond(fd, 200, "OK", list.dump());
  }
  if (file) {
    bool ok = false;
    std::string body = read_file(repo.root + "/" + rest, ok);
    if (!ok) return respond(fd, 404, "Not Found", "Entry not found");
    if (repo.corrupted.count(rest)) body = repo.corrupted.at(rest);
    if (range.rfind("bytes=", 0) == 0) {
      const size_t from = std::stoul(range.substr(6));
      if (from >= body.size()) return respond(fd, 416, "Range Not Satisfiable", "");
      return respond(fd, 206, "Partial Content", body.substr(from),
                     "Content-Range: bytes " + std::to_string(from) + "-" +
                         std::to_string(body.size() - 1) + "/" + std::to_string(body.size()) +
                         "\r\n");
    }
    return respond(fd, 200, "OK", body);
  }
  respond(fd, 404, "Not Found", "{\"error\":\"unknown API\"}");
}

}  // namespace libreyolo::test
