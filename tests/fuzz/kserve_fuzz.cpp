// libFuzzer entry: arbitrary bytes through parse_infer_request, and what it accepts echoed back
// through render_infer_response. Either may throw api::Error; nothing else may happen (no
// crash, no other exception, no sanitizer report).
// Input: 2 bytes little-endian H, then the body. H = 0xffff: no Inference-Header-Content-Length;
// H = 0xfffe: the header value is the body up to its first '\n' (fuzzes the header's parsing);
// otherwise the header is the decimal H.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/http/kserve_json.h"

using namespace libreyolo::server;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const unsigned h = data[0] | (unsigned{data[1]} << 8);
  std::string_view body(reinterpret_cast<const char*>(data + 2), size - 2);
  std::string header;
  std::optional<std::string_view> length;
  if (h == 0xfffe) {
    const auto nl = body.find('\n');
    header = std::string(body.substr(0, nl));
    body = nl == std::string_view::npos ? std::string_view() : body.substr(nl + 1);
    length = header;
  } else if (h != 0xffff) {
    header = std::to_string(h);
    length = header;
  }
  try {
    const http::ParsedInfer p = http::parse_infer_request(body, length, "m", "1");
    api::InferResponse echo;
    echo.model_name = p.request.model_name;
    echo.model_version = "1";
    echo.id = p.request.id;
    for (const auto& t : p.request.inputs)
      echo.outputs.push_back({t.name, t.datatype, t.shape, std::string(t.data())});
    (void)http::render_infer_response(echo, p.format);
  } catch (const api::Error&) {
  }
  return 0;
}
