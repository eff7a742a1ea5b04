#include "kernels/hub/http.h"

#include <curl/curl.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

namespace libreyolo::kernels::hub {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

using Easy = std::unique_ptr<CURL, decltype(&curl_easy_cleanup)>;
using Headers = std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)>;

double seconds_left(const HttpOptions& o) {
  if (o.deadline == std::chrono::steady_clock::time_point::max()) return 1e9;
  return std::chrono::duration<double>(o.deadline - std::chrono::steady_clock::now()).count();
}

size_t to_string(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

struct FileSink {
  FILE* file = nullptr;
  CURL* curl = nullptr;
  long offset = 0;  // bytes already on disk when the request started
  bool checked = false;
};

size_t to_file(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<FileSink*>(user);
  if (!sink->checked) {
    sink->checked = true;
    long status = 0;
    curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status == 200 && sink->offset > 0) {  // range ignored: the body is the whole file
      if (std::fflush(sink->file) != 0 || ftruncate(fileno(sink->file), 0) != 0) return 0;
      std::fseek(sink->file, 0, SEEK_SET);
    }
  }
  return std::fwrite(data, size, n, sink->file);
}

// One attempt. Returns "" on success, else the error text; sets status and transient.
std::string attempt(const std::string& url, const HttpOptions& o, std::string* body, FileSink* sink,
                    long& status, bool& transient) {
  global_init();
  status = 0;
  transient = false;
  const double left = seconds_left(o);
  if (left <= 0) return "deadline exceeded before the request";
  Easy curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) return "curl_easy_init failed";
  CURL* c = curl.get();
  char err[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, o.user_agent.c_str());
  const long total_ms = static_cast<long>(std::max(1.0, left * 1000.0));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, total_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   std::min(total_ms, static_cast<long>(o.connect_timeout_seconds * 1000.0)));
  Headers headers(nullptr, &curl_slist_free_all);
  if (!o.token.empty()) {
    // A custom Authorization header is not forwarded to another host on redirect (curl >= 7.58).
    headers.reset(
        curl_slist_append(headers.release(), ("Authorization: Bearer " + o.token).c_str()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  }
  if (body) {
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &to_string);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
  } else {
    sink->curl = c;
    sink->checked = false;
    if (sink->offset > 0) curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, curl_off_t(sink->offset));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &to_file);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (rc == CURLE_OK) return "";
  std::string what = err[0] ? err : curl_easy_strerror(rc);
  if (rc == CURLE_HTTP_RETURNED_ERROR) {
    // 416 on a resumed download: the partial file is already complete.
    if (status == 416 && sink && sink->offset > 0) return "";
    transient = status == 429 || status >= 500;
    return "HTTP " + std::to_string(status);
  }
  transient = rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
              rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_RECV_ERROR ||
              rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE;
  return what;
}

template <class Fn>
void with_retries(const std::string& url, const HttpOptions& o, Fn&& once) {
  double backoff = o.backoff_seconds;
  for (int i = 0;; ++i) {
    long status = 0;
    bool transient = false;
    const std::string error = once(status, transient);
    if (error.empty()) return;
    const bool out_of_time = seconds_left(o) <= backoff;
    if (!transient || i >= o.retries || out_of_time) {
      throw HttpError("GET " + url + ": " + error +
                          (i > 0 ? " (after " + std::to_string(i + 1) + " attempts)" : ""),
                      status, transient);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff *= 2;
  }
}

}  // namespace

std::string http_get(const std::string& url, const HttpOptions& options) {
  std::string body;
  with_retries(url, options, [&](long& status, bool& transient) {
    body.clear();
    return attempt(url, options, &body, nullptr, status, transient);
  });
  return body;
}

void http_download(const std::string& url, const std::string& partial_path,
                   const HttpOptions& options) {
  with_retries(url, options, [&](long& status, bool& transient) -> std::string {
    std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(partial_path.c_str(), "ab"),
                                                    &std::fclose);
    if (!f) {
      status = 0;
      transient = false;
      return "cannot write " + partial_path;
    }
    FileSink sink;
    sink.file = f.get();
    struct stat st {};
    if (::stat(partial_path.c_str(), &st) == 0) sink.offset = static_cast<long>(st.st_size);
    std::string error = attempt(url, options, nullptr, &sink, status, transient);
    if (std::fflush(f.get()) != 0 && error.empty()) error = "cannot write " + partial_path;
    return error;
  });
}

std::string url_escape_segment(const std::string& segment) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : segment) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += digits[ch >> 4];
      out += digits[ch & 15];
    }
  }
  return out;
}

}  // namespace libreyolo::kernels::hub
