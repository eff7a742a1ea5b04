// The hub provider's HTTP client (libcurl): JSON API calls and resumable file downloads, with a
// per-provider deadline, retries with exponential backoff and an optional bearer token.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

namespace libreyolo::kernels::hub {

/// How requests are made. `deadline` bounds every attempt and every backoff sleep together,
/// so a caller's start-up never waits longer than it allows, however many retries are left.
struct HttpOptions {
  std::string token;  ///< sent as "Authorization: Bearer <token>" when not empty (HF_TOKEN)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  double connect_timeout_seconds = 10.0;  ///< per attempt, also capped by the deadline
  int retries = 3;                        ///< extra attempts after a transient failure
  double backoff_seconds = 0.2;           ///< first wait; doubled after every attempt
  std::string user_agent = "libreyolo-server-hub/0.1";
};

/// A request that failed for good. `status` is the HTTP status (0: no response: DNS, connection
/// refused, timeout); `transient` tells whether retrying later could help.
class HttpError : public std::runtime_error {
 public:
  HttpError(const std::string& what, long status, bool transient)
      : std::runtime_error(what), status(status), transient(transient) {}
  long status;
  bool transient;
};

/// GET `url` and returns the body. Only http and https; redirects followed (the token is not
/// sent to another host). Throws HttpError naming the URL and the cause.
std::string http_get(const std::string& url, const HttpOptions& options);

/// GET `url` into `partial_path`: when that file exists its bytes are kept and the rest is
/// requested with a Range header (resumable, as huggingface_hub's `.incomplete` files); a server
/// that ignores the range restarts the file. Throws HttpError; the partial file stays for the
/// next attempt.
void http_download(const std::string& url, const std::string& partial_path,
                   const HttpOptions& options);

/// Percent-encodes one URL path segment (RFC 3986 unreserved characters are kept).
std::string url_escape_segment(const std::string& segment);

}  // namespace libreyolo::kernels::hub
