#include "server/api/types.h"

namespace libreyolo::server::api {

const char* code_name(Code code) {
  switch (code) {
    case Code::ok:
      return "OK";
    case Code::cancelled:
      return "CANCELLED";
    case Code::unknown:
      return "UNKNOWN";
    case Code::invalid_argument:
      return "INVALID_ARGUMENT";
    case Code::deadline_exceeded:
      return "DEADLINE_EXCEEDED";
    case Code::not_found:
      return "NOT_FOUND";
    case Code::permission_denied:
      return "PERMISSION_DENIED";
    case Code::resource_exhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::failed_precondition:
      return "FAILED_PRECONDITION";
    case Code::unimplemented:
      return "UNIMPLEMENTED";
    case Code::internal:
      return "INTERNAL";
    case Code::unavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

}  // namespace libreyolo::server::api
