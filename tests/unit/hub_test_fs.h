// Small POSIX file helpers for the hub tests. Not std::filesystem: libtorch.so exports its own
// copies of some std::filesystem symbols (e.g. remove_all), which the dynamic linker may bind to
// and which crash in this process.
#pragma once

#include <dirent.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace libreyolo::test::hubfs {

inline bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

inline bool is_symlink(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

inline std::string read_link(const std::string& p) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(p.c_str(), buf, sizeof buf - 1);
  return n < 0 ? "" : std::string(buf, static_cast<size_t>(n));
}

inline std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : "";
}

inline void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    ::mkdir(path.substr(0, pos).c_str(), 0755);
  }
}

inline void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

/// A fresh empty folder under /tmp.
inline std::string temp_dir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  return made ? std::string(made) : "";
}

/// Names in `dir` (no "." / "..").
inline std::vector<std::string> list(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

/// Regular files under `dir`, as paths relative to it.
inline std::vector<std::string> files_under(const std::string& dir, const std::string& rel = "") {
  std::vector<std::string> out;
  for (const auto& n : list(rel.empty() ? dir : dir + "/" + rel)) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    struct stat st {};
    if (::stat((dir + "/" + r).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      for (auto& f : files_under(dir, r)) out.push_back(f);
    } else if (S_ISREG(st.st_mode)) {
      out.push_back(r);
    }
  }
  return out;
}

inline std::string read(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write(const std::string& p, const std::string& content) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
}

}  // namespace libreyolo::test::hubfs
