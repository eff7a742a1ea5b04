#include "server/http/reply.h"

#include <utility>

#include "server/http/kserve_json.h"

namespace libreyolo::server::http {

void send_json(httplib::Response& res, int status, std::string body) {
  res.status = status;
  res.body = std::move(body);
  res.set_header("Content-Type", "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  send_json(res, status, render_error(message));
}

void send_empty(httplib::Response& res) {
  res.status = 200;
  res.body.clear();
}

std::string shown_path(const std::string& path) {
  return path.size() <= 64 ? path
                           : path.substr(0, 48) + "... (" + std::to_string(path.size()) + " bytes)";
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 416:
      return "Range Not Satisfiable";
    case 417:
      return "Expectation Failed";
    case 500:
      return "Internal Server Error";
    default:
      return "HTTP error";
  }
}

}  // namespace libreyolo::server::http
