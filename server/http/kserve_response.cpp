// KServe v2 REST codec, response side (see kserve_json.h): the infer response in JSON or with
// Triton's binary tensor data, metadata, configuration, statistics, the repository index,
// shared-memory status, error bodies and the HTTP status of each api::Code.
#include "server/http/kserve_json.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "server/http/kserve_json_detail.h"

namespace libreyolo::server::http {
using namespace kserve_detail;  // the codec's shared helpers

namespace {

json tensor_json(const api::TensorMetadata& t) {
  return {{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}};
}

/// The JSON `data` of one output (flat, row-major).
json output_data(const api::OutputTensor& t, std::uint64_t count) {
  const std::string& d = t.data;
  const std::size_t size = element_size(t.datatype);
  json out = json::array();
  auto internal = [&](const std::string& m) {
    throw Error(Code::internal, "output " + quote_name(t.name) + ": " + m);
  };
  if (t.datatype == "BYTES") {
    std::size_t at = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      if (d.size() - at < 4) internal("BYTES data ends inside element " + std::to_string(i));
      const auto n = get<std::uint32_t>(d.data() + at);
      at += 4;
      if (d.size() - at < n) internal("BYTES data ends inside element " + std::to_string(i));
      out.push_back(d.substr(at, n));
      at += n;
    }
    if (at != d.size()) internal("BYTES data is longer than its shape");
    return out;
  }
  if (size == 0) internal("unknown datatype " + t.datatype);
  if (d.size() % size != 0 || d.size() / size != count)
    internal(std::to_string(d.size()) + " bytes for shape " + shape_text(t.shape) + " of " +
             t.datatype);
  const char* p = d.data();
  for (std::uint64_t i = 0; i < count; ++i, p += size) {
    const std::string& dt = t.datatype;
    if (dt == "FP32") {
      out.push_back(static_cast<double>(get<float>(p)));
    } else if (dt == "FP64") {
      out.push_back(get<double>(p));
    } else if (dt == "FP16") {
      out.push_back(static_cast<double>(half_to_float(get<std::uint16_t>(p))));
    } else if (dt == "BF16") {
      out.push_back(static_cast<double>(bfloat16_to_float(get<std::uint16_t>(p))));
    } else if (dt == "INT64") {
      out.push_back(get<std::int64_t>(p));
    } else if (dt == "INT32") {
      out.push_back(get<std::int32_t>(p));
    } else if (dt == "INT16") {
      out.push_back(get<std::int16_t>(p));
    } else if (dt == "INT8") {
      out.push_back(get<std::int8_t>(p));
    } else if (dt == "UINT64") {
      out.push_back(get<std::uint64_t>(p));
    } else if (dt == "UINT32") {
      out.push_back(get<std::uint32_t>(p));
    } else if (dt == "UINT16") {
      out.push_back(get<std::uint16_t>(p));
    } else if (dt == "UINT8") {
      out.push_back(get<std::uint8_t>(p));
    } else {  // BOOL
      out.push_back(*p != 0);
    }
  }
  return out;
}

/// `data` as JSON text. nlohmann writes a non-finite double as `null`; Triton's writer
/// (triton-inference-server/common include/triton/common/triton_json.h, Value::Write) sets
/// rapidjson's kWriteNanAndInfFlag, which writes the bare tokens NaN, Infinity and -Infinity
/// (rapidjson/writer.h Writer::Double), and tritonclient.http reads the body with Python's json,
/// which accepts them. Finite elements keep nlohmann's number text.
std::string data_text(const json& data) {
  const bool non_finite = std::any_of(data.begin(), data.end(), [](const json& v) {
    return v.is_number_float() && !std::isfinite(v.get<double>());
  });
  if (!non_finite) return dump(data);
  std::string out = "[";
  for (const auto& v : data) {
    if (out.size() > 1) out += ',';
    if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      const double d = v.get<double>();
      out += std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
    } else {
      out += dump(v);
    }
  }
  return out + "]";
}

std::string config_type(const std::string& dt) {
  return dt == "BYTES" ? "TYPE_STRING" : "TYPE_" + dt;
}

json duration_json(const api::Duration& d) { return {{"count", d.count}, {"ns", d.ns}}; }

}  // namespace

bool OutputFormat::is_binary(const std::string& output) const {
  const auto it = binary.find(output);
  return it == binary.end() ? binary_default : it->second;
}

RenderedBody render_infer_response(const api::InferResponse& response, const OutputFormat& format) {
  json j = {{"model_name", response.model_name}, {"model_version", response.model_version}};
  if (!response.id.empty()) j["id"] = response.id;
  // Written as text, not as one json document, so that a JSON `data` array can hold NaN and
  // Infinity (data_text). Keys in nlohmann's (sorted) order: "data" is the first key of an
  // output, "outputs" the last of the response.
  std::string outputs = "[";
  std::string binary;
  bool any_binary = false;
  for (const auto& t : response.outputs) {
    if (outputs.size() > 1) outputs += ',';
    json o = {{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}};
    if (const auto it = format.in_shm.find(t.name); it != format.in_shm.end()) {
      // Written into shared memory: the parameters name the region, no data (Triton).
      json params = json::object();
      for (const auto& [key, value] : it->second)
        std::visit([&, k = key](const auto& v) { params[k] = v; }, value);
      o["parameters"] = std::move(params);
      outputs += dump(o);
      continue;
    }
    // Saturating: a shape whose product overflows matches no data (output_data refuses it).
    std::uint64_t count = 1;
    for (const auto d : t.shape) {
      const auto u = static_cast<std::uint64_t>(d < 0 ? 0 : d);
      count = u != 0 && count > UINT64_MAX / u ? UINT64_MAX : count * u;
    }
    // The task's own output parameters (prompted detection: truncated_labels on `labels`).
    if (!t.parameters.empty()) {
      json params = json::object();
      for (const auto& [key, value] : t.parameters)
        std::visit([&, k = key](const auto& v) { params[k] = v; }, value);
      o["parameters"] = std::move(params);
    }
    if (format.is_binary(t.name)) {
      o["parameters"]["binary_data_size"] = t.data.size();
      binary += t.data;
      any_binary = true;
      outputs += dump(o);
    } else {
      const std::string data = data_text(output_data(t, count));
      outputs += "{\"data\":" + data + "," + dump(o).substr(1);
    }
  }
  outputs += "]";
  RenderedBody out;
  out.body = dump(j);
  out.body.insert(out.body.size() - 1, ",\"outputs\":" + outputs);
  if (any_binary) {
    out.header_length = out.body.size();
    out.body += binary;
  }
  return out;
}

std::string render_server_metadata(const api::ServerMetadata& m) {
  return dump({{"name", m.name}, {"version", m.version}, {"extensions", m.extensions}});
}

std::string render_model_metadata(const api::ModelMetadata& m) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : m.inputs) inputs.push_back(tensor_json(t));
  for (const auto& t : m.outputs) outputs.push_back(tensor_json(t));
  return dump({{"name", m.name},
               {"versions", m.versions},
               {"platform", m.platform},
               {"inputs", inputs},
               {"outputs", outputs}});
}

std::string render_model_config(const api::ModelConfig& c) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : c.inputs)
    inputs.push_back({{"name", t.name},
                      {"data_type", config_type(t.datatype)},
                      {"dims", t.shape},
                      {"optional", t.optional}});
  for (const auto& t : c.outputs)
    outputs.push_back(
        {{"name", t.name}, {"data_type", config_type(t.datatype)}, {"dims", t.shape}});
  json params = json::object();
  for (const auto& [k, v] : c.parameters) params[k] = {{"string_value", v}};
  json groups = json::array();
  for (const auto& g : c.instance_group)
    groups.push_back({{"name", g.name}, {"kind", g.kind}, {"count", g.count}, {"gpus", g.gpus}});
  return dump({{"name", c.name},
               {"platform", c.platform},
               {"backend", c.backend},
               {"max_batch_size", c.max_batch_size},
               {"input", inputs},
               {"output", outputs},
               {"instance_group", groups},
               {"dynamic_batching",
                {{"max_queue_delay_microseconds", c.max_queue_delay_microseconds},
                 {"default_queue_policy",
                  {{"max_queue_size", c.max_queue_size},
                   {"default_timeout_microseconds", c.default_timeout_microseconds}}}}},
               {"parameters", params}});
}

std::string render_statistics(const std::vector<api::ModelStatistics>& stats) {
  json models = json::array();
  for (const auto& s : stats) {
    json batches = json::array();
    for (const auto& b : s.batch_stats)
      batches.push_back({{"batch_size", b.batch_size},
                         {"compute_input", duration_json(b.compute_input)},
                         {"compute_infer", duration_json(b.compute_infer)},
                         {"compute_output", duration_json(b.compute_output)}});
    models.push_back({{"name", s.name},
                      {"version", s.version},
                      {"last_inference", s.last_inference_ms},
                      {"inference_count", s.inference_count},
                      {"execution_count", s.execution_count},
                      {"inference_stats",
                       {{"success", duration_json(s.success)},
                        {"fail", duration_json(s.fail)},
                        {"queue", duration_json(s.queue)},
                        {"compute_input", duration_json(s.compute_input)},
                        {"compute_infer", duration_json(s.compute_infer)},
                        {"compute_output", duration_json(s.compute_output)}}},
                      {"batch_stats", batches}});
  }
  return dump({{"model_stats", models}});
}

std::string render_repository_index(const std::vector<api::RepositoryEntry>& entries) {
  json out = json::array();
  for (const auto& e : entries)
    out.push_back(
        {{"name", e.name}, {"version", e.version}, {"state", e.state}, {"reason", e.reason}});
  return dump(out);
}

std::string render_system_status(const std::vector<shm::SystemStatus>& regions) {
  json out = json::array();
  for (const auto& r : regions)
    out.push_back(
        {{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.byte_size}});
  return dump(out);
}

std::string render_cuda_status(const std::vector<shm::CudaStatus>& regions) {
  json out = json::array();
  for (const auto& r : regions)
    out.push_back({{"name", r.name}, {"device_id", r.device_id}, {"byte_size", r.byte_size}});
  return dump(out);
}

std::string render_error(const std::string& message) {
  std::string m = message;
  if (m.size() > kMaxMessageBytes) {
    const std::size_t total = m.size();
    m.resize(kMaxMessageBytes);
    m += "... (" + std::to_string(total) + " bytes, clipped)";
  }
  return dump({{"error", m}});
}

int http_status(api::Code code) {
  switch (code) {
    case Code::ok:
      return 200;
    case Code::not_found:
      return 404;
    case Code::unavailable:
      return 503;
    case Code::internal:
      return 500;
    case Code::unimplemented:
      return 501;
    case Code::deadline_exceeded:
      return 504;
    case Code::resource_exhausted:
      return 429;
    case Code::permission_denied:
      return 403;
    case Code::cancelled:
    case Code::unknown:
    case Code::already_exists:  // Triton: a region registered twice is 400 (HttpCodeFromError)
    case Code::invalid_argument:
    case Code::failed_precondition:
      return 400;
  }
  return 400;
}

}  // namespace libreyolo::server::http
