#include "server/repository/model_name.h"

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "log/log.h"
#include "server/api/types.h"

namespace libreyolo::server {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const std::string& name, const std::string& problem) {
  const std::string message = "model_name '" + printable_name(name) + "': " + problem;
  log::warn("model control: refused " + message);
  throw api::Error(api::Code::invalid_argument, message);
}

/// realpath(3) of `path`; "" when it does not resolve (missing, dangling link, loop).
std::string resolved(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool is_version(const std::string& s) {
  if (s.empty() || s.size() > 17 || s[0] == '0') return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::string printable_name(const std::string& name, std::size_t max_bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (out.size() >= max_bytes) return out + "...";
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string quoted_name(const std::string& name) {
  // The limits of models::core::clip_json_error.
  constexpr std::size_t kLongest = 64, kKept = 48;
  if (name.size() <= kLongest) return "'" + printable_name(name, SIZE_MAX) + "'";
  return "'" + printable_name(name.substr(0, kKept), SIZE_MAX) + "...' (" +
         std::to_string(name.size()) + " bytes)";
}

void check_model_name(const std::string& name) {
  if (name.empty()) refuse(name, "empty; expected the name of a folder of the model repository");
  if (name.size() > kMaxModelNameBytes) {
    refuse(name, "longer than " + std::to_string(kMaxModelNameBytes) + " bytes (" +
                     std::to_string(name.size()) + ")");
  }
  if (name == "." || name == "..") {
    refuse(name, "'.' and '..' are not model names; expected a folder of the model repository");
  }
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) refuse(name, "contains a control character");
  }
  if (name.find('/') != std::string::npos || name.find('\\') != std::string::npos) {
    refuse(name,
           "contains a path separator ('/' or '\\'); a model name is a plain folder name "
           "inside the model repository, not a path");
  }
}

std::string model_folder(const std::string& repository, const std::string& name) {
  check_model_name(name);
  const std::string folder = (fs::path(repository) / name).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(folder, ec))) {
    throw api::Error(api::Code::not_found,
                     "unknown model '" + name + "': no folder " + folder + " in the repository");
  }
  const std::string root = resolved(repository);
  const std::string target = resolved(folder);
  if (root.empty() || target.empty()) {
    refuse(name, "the folder " + folder + " does not resolve (dangling symbolic link?)");
  }
  // The folder itself must resolve to <root>/<something>: a symbolic link to another place of
  // the repository is allowed, one that leaves it is not.
  if (target.size() <= root.size() + 1 || target.compare(0, root.size(), root) != 0 ||
      (root != "/" && target[root.size()] != '/')) {
    refuse(name, "the folder " + folder +
                     " is a symbolic link resolving outside the model repository (to " +
                     printable_name(target, PATH_MAX) + ")");
  }
  if (!fs::is_directory(target, ec)) {
    throw api::Error(api::Code::not_found,
                     "unknown model '" + name + "': " + folder + " is not a folder");
  }
  return folder;
}

std::int64_t highest_version(const std::string& folder) {
  std::int64_t best = -1;
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(folder, ec)) {
    const std::string s = v.path().filename().string();
    std::error_code dir_ec;
    if (is_version(s) && v.is_directory(dir_ec) && std::stoll(s) > best) best = std::stoll(s);
  }
  return best;
}

}  // namespace libreyolo::server
