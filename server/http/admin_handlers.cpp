#include "server/http/admin_handlers.h"

#include "server/http/reply.h"

namespace libreyolo::server::http {

bool serve_admin(const Route& r, api::InferenceService& core, const AdminHandlers& admin,
                 httplib::Response& res) {
  switch (r.kind) {
    case Route::live: {
      const bool ok = core.live();
      send_json(res, ok ? 200 : 503, ok ? "{\"live\":true}" : "{\"live\":false}");
      return true;
    }
    case Route::ready: {
      const bool ok = core.ready();
      send_json(res, ok ? 200 : 503, ok ? "{\"ready\":true}" : "{\"ready\":false}");
      return true;
    }
    case Route::active:
      send_json(res, 200, admin.active_json());
      return true;
    case Route::metrics:
      res.status = 200;
      res.body = admin.metrics_text();
      res.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
      return true;
    default:
      return false;
  }
}

}  // namespace libreyolo::server::http
