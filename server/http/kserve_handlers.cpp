#include "server/http/kserve_handlers.h"

#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "log/log.h"
#include "server/http/acceptor.h"
#include "server/http/kserve_json.h"
#include "server/http/reply.h"
#include "server/shm/tensor_params.h"

namespace libreyolo::server::http {

void KServeHandlers::get(const Route& r, httplib::Response& res) {
  switch (r.kind) {
    case Route::server_metadata: {
      api::ServerMetadata m = core_.server_metadata();
      // The transport serves these (Triton's extension names), as the gRPC side lists them.
      m.extensions.push_back("system_shared_memory");
      if (shm::Registry::cuda_built()) m.extensions.push_back("cuda_shared_memory");
      return send_json(res, 200, render_server_metadata(m));
    }
    case Route::shm_status:
      return send_json(res, 200,
                       r.cuda ? render_cuda_status(registry_.cuda_status(r.region))
                              : render_system_status(registry_.system_status(r.region)));
    case Route::all_stats:
      return send_json(res, 200, render_statistics(core_.model_statistics("", "")));
    case Route::model_metadata:
      return send_json(res, 200, render_model_metadata(core_.model_metadata(r.model, r.version)));
    case Route::model_ready: {
      const bool ok = core_.model_ready(r.model, r.version);
      return send_json(res, ok ? 200 : 503, ok ? "{\"ready\":true}" : "{\"ready\":false}");
    }
    case Route::model_config:
      return send_json(res, 200, render_model_config(core_.model_config(r.model, r.version)));
    case Route::model_stats:
      return send_json(res, 200, render_statistics(core_.model_statistics(r.model, r.version)));
    default:
      return send_error(res, 404, "not found");
  }
}

void KServeHandlers::post(const Route& r, const httplib::Request& req, const std::string& body,
                          httplib::Response& res) {
  switch (r.kind) {
    case Route::repository_index:
      return send_json(
          res, 200,
          render_repository_index(core_.repository_index(parse_repository_index_request(body))));
    case Route::load:
      check_repository_request(body, "the load request body");
      core_.load_model(r.model);
      return send_json(res, 200, "{}");
    case Route::unload:
      check_repository_request(body, "the unload request body");
      core_.unload_model(r.model);
      return send_json(res, 200, "{}");
    case Route::infer:
      return infer(r, req, body, res);
    case Route::shm_register:
      return register_region(r, body, res);
    case Route::shm_unregister:
      check_repository_request(body, "the unregister request body");
      if (r.cuda) {
        registry_.unregister_cuda(r.region);
      } else {
        registry_.unregister_system(r.region);
      }
      return send_empty(res);
    default:
      return send_error(res, 404, "not found: " + shown_path(req.path));
  }
}

/// The same Registry calls, errors and log lines as the gRPC side's
/// (server/grpc/grpc_server.cpp SystemSharedMemoryRegister, CudaSharedMemoryRegister).
void KServeHandlers::register_region(const Route& r, const std::string& body,
                                     httplib::Response& res) {
  if (r.cuda) {
    const CudaRegisterRequest c = parse_cuda_register(body);
    registry_.register_cuda(r.region, c.raw_handle, c.device_id, c.byte_size);
    log::info("CUDA shared memory region '" + r.region + "' registered (device " +
              std::to_string(c.device_id) + ", " + std::to_string(c.byte_size) + " bytes)");
  } else {
    const SystemRegisterRequest q = parse_system_register(body);
    registry_.register_system(r.region, q.key, q.offset, q.byte_size);
    log::info("system shared memory region '" + r.region + "' registered (key '" + q.key +
              "', offset " + std::to_string(q.offset) + ", " + std::to_string(q.byte_size) +
              " bytes)");
  }
  send_empty(res);
}

void KServeHandlers::infer(const Route& r, const httplib::Request& req, const std::string& body,
                           httplib::Response& res) {
  std::optional<std::string> header;
  if (req.has_header("Inference-Header-Content-Length"))
    header = req.get_header_value("Inference-Header-Content-Length");
  ParsedInfer parsed = parse_infer_request(
      body, header ? std::optional<std::string_view>(*header) : std::nullopt, r.model, r.version);
  auto token = std::make_shared<api::CancelToken>();
  parsed.request.cancel = token;
  // Removed on every way out of this function: the fd is the connection's, which outlives it.
  struct Watch {
    PeerWatcher& watcher;
    std::uint64_t id;
    ~Watch() { watcher.remove(id); }
  } watch{watcher_,
          watcher_.add(tl_connection ? tl_connection->fd : -1, parsed.request.deadline, token)};
  // Shared memory (server/shm/tensor_params.h, as the gRPC side): inputs copy their region's
  // bytes (system) or name its device bytes (CUDA); the Views keep every region alive until
  // this response is rendered, whatever unregisters it meanwhile.
  std::vector<shm::View> held;
  for (std::size_t i = 0; i < parsed.input_shm.size(); ++i) {
    if (parsed.input_shm[i].used)
      shm::bind_input(parsed.request.inputs[i], parsed.input_shm[i], registry_, held,
                      "the request ('data' or binary_data_size)");
  }
  std::vector<shm::OutputRegion> out_regions;
  for (const auto& [name, p] : parsed.output_shm)
    out_regions.push_back(shm::bind_output(name, p, registry_));
  const api::InferResponse response = core_.infer(std::move(parsed.request));
  if (!out_regions.empty()) {
    auto target = [&](const std::string& name) -> const shm::OutputRegion* {
      const shm::OutputRegion* found = nullptr;
      for (const auto& o : out_regions)
        if (o.name == name) found = &o;
      return found;
    };
    for (const auto& t : response.outputs)  // every one fits before any is written
      if (const auto* o = target(t.name)) shm::check_output(t, *o);
    for (const auto& t : response.outputs) {
      if (const auto* o = target(t.name)) {
        shm::write_output(t, *o);
        parsed.format.in_shm[t.name] = shm::output_params(t, *o);
      }
    }
  }
  RenderedBody out = render_infer_response(response, parsed.format);
  res.status = 200;
  res.body = std::move(out.body);
  if (out.header_length) {
    res.set_header("Inference-Header-Content-Length", std::to_string(*out.header_length));
    res.set_header("Content-Type", "application/octet-stream");
  } else {
    res.set_header("Content-Type", "application/json");
  }
}

}  // namespace libreyolo::server::http
