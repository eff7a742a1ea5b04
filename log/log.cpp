#include "log/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <stdexcept>

namespace libreyolo::log {
namespace {

struct Sinks {
  std::mutex mutex;
  std::map<int, Sink> extra;
  int next_id = 1;
  Level console_level = Level::info;
  std::shared_ptr<spdlog::logger> console = spdlog::stderr_color_mt("libreyolo");
};

Sinks& sinks() {
  static Sinks* s = new Sinks();  // never destroyed: logging from static destructors stays safe
  return *s;
}

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

Level parse_level(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "debug") return Level::debug;
  if (s == "info") return Level::info;
  if (s == "warn" || s == "warning") return Level::warn;
  if (s == "error") return Level::error;
  if (s == "off") return Level::off;
  throw std::invalid_argument("unknown log level '" + std::string(name) +
                              "' (expected debug, info, warn, error or off)");
}

const char* level_name(Level level) {
  switch (level) {
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
    case Level::off:
      return "off";
  }
  return "?";
}

void write(Level level, std::string_view message) {
  try {
    auto& s = sinks();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (level >= s.console_level && level != Level::off) {
      s.console->log(to_spdlog(level), "{}", message);
    }
    for (auto& [id, sink] : s.extra) sink(level, message);
  } catch (...) {
    // A failing sink must never take a request down with it.
  }
}

void set_level(Level level) {
  auto& s = sinks();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.console_level = level;
  s.console->set_level(spdlog::level::trace);
}

Level level() {
  auto& s = sinks();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.console_level;
}

int add_sink(Sink sink) {
  auto& s = sinks();
  std::lock_guard<std::mutex> lock(s.mutex);
  int id = s.next_id++;
  s.extra.emplace(id, std::move(sink));
  return id;
}

void remove_sink(int id) {
  auto& s = sinks();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.extra.erase(id);
}

struct Capture::State {
  mutable std::mutex mutex;
  std::vector<Line> lines;
};

Capture::Capture() : state_(new State()) {
  State* st = state_;
  id_ = add_sink([st](Level l, std::string_view m) {
    std::lock_guard<std::mutex> lock(st->mutex);
    st->lines.push_back({l, std::string(m)});
  });
}

Capture::~Capture() {
  remove_sink(id_);
  delete state_;
}

std::vector<Capture::Line> Capture::lines() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->lines;
}

int Capture::count(Level level, std::string_view needle) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  int n = 0;
  for (const auto& l : state_->lines) {
    if (l.level == level && l.text.find(needle) != std::string::npos) ++n;
  }
  return n;
}

}  // namespace libreyolo::log
