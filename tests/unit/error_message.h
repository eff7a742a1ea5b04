// What the unit tests compare exact error messages with.
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace libreyolo::test {

/// The message of the c10::Error f() throws, without its backtrace; "" when it throws nothing.
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace libreyolo::test
