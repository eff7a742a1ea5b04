// Logging facade. It exists because LibTorch ships fmt 12 headers and spdlog 1.10 needs fmt 9:
// code that sees torch's include folder must never include spdlog. Callers format their own
// message (c10::str, std::ostringstream) and hand a finished string over.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace libreyolo::log {

/// Severity, ordered. `off` silences the default console sink.
enum class Level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

/// Parses "debug" | "info" | "warn" | "warning" | "error" | "off" (case-insensitive).
/// Throws std::invalid_argument naming the value otherwise.
Level parse_level(std::string_view name);

/// Name of a level as printed in log lines ("debug", "info", ...).
const char* level_name(Level level);

/// Writes one line to every sink (console sink: stderr, spdlog format with a timestamp).
/// Thread-safe; never throws.
void write(Level level, std::string_view message);

inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warn(std::string_view m) { write(Level::warn, m); }
inline void error(std::string_view m) { write(Level::error, m); }

/// Minimum level of the console sink (default info; LIBREYOLO_LOG_LEVEL is read by the programs,
/// not here, so that this library has no hidden global input).
void set_level(Level level);
Level level();

/// Extra sink, receiving every message at every level (tests count warnings with it).
using Sink = std::function<void(Level, std::string_view)>;

/// Adds a sink and returns its id for remove_sink.
int add_sink(Sink sink);
void remove_sink(int id);

/// RAII capture of every message written while it lives (tests).
class Capture {
 public:
  Capture();
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  struct Line {
    Level level;
    std::string text;
  };
  /// Copy of the lines captured so far.
  std::vector<Line> lines() const;
  /// Number of captured lines at exactly `level` whose text contains `needle`.
  int count(Level level, std::string_view needle = {}) const;

 private:
  struct State;
  State* state_;
  int id_;
};

}  // namespace libreyolo::log
