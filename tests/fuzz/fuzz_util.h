// Helpers shared by the libFuzzer targets of tests/fuzz (no torch, no protobuf).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace libreyolo::fuzz {

/// A broken invariant: prints what and aborts, so that libFuzzer records the input as a crash.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

/// Error messages are one line that starts with the file they name (the project's rule for
/// configuration and checkpoint errors: "<file>: ..." or "<file>:LINE:COLUMN: ...").
inline void expect_message(const std::string& message, const std::string& file) {
  if (message.compare(0, file.size(), file) != 0)
    fail("message does not start with '" + file + "': " + message);
  if (message.find('\n') != std::string::npos) fail("message has several lines: " + message);
}

}  // namespace libreyolo::fuzz
