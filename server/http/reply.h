// Writing HTTP answers: the JSON body every status shares, and the texts for error messages.
#pragma once

#include <httplib.h>

#include <string>

namespace libreyolo::server::http {

/// `status` with `body` as application/json.
void send_json(httplib::Response& res, int status, std::string body);

/// `status` with the KServe error body {"error": "<message>"}.
void send_error(httplib::Response& res, int status, const std::string& message);

/// 200 with an empty body: Triton's answer to a shared-memory register / unregister
/// (src/http_server.cc HandleSystemSharedMemory, HandleCudaSharedMemory).
void send_empty(httplib::Response& res);

/// The path for error messages: at most 64 bytes shown.
std::string shown_path(const std::string& path);

/// The reason phrases of the statuses httplib answers by itself (RFC 9110 section 15).
const char* reason_phrase(int status);

}  // namespace libreyolo::server::http
