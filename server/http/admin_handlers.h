// The endpoints that are not KServe inference: health (/v2/health/live, /v2/health/ready, which
// load balancers and probes call) and the operator's /active and /metrics.
#pragma once

#include <httplib.h>

#include "server/api/types.h"
#include "server/http/http_server.h"
#include "server/http/router.h"

namespace libreyolo::server::http {

/// Answers `r` when it is an admin route (live, ready, active, metrics) and returns true;
/// false, with `res` untouched, for any other route.
bool serve_admin(const Route& r, api::InferenceService& core, const AdminHandlers& admin,
                 httplib::Response& res);

}  // namespace libreyolo::server::http
