#!/usr/bin/env bash
# The floor order of the tree, in one place: a file may include its own floor and the floors
# below it, never one above (DESIGN.md "Layout"). Exits 1 naming file:line and both floors for
# every include that points up. Test code (tests/, fuzz targets included: tests/fuzz/)
# is the top floor and is not checked.
#
# usage: scripts/check-floors.sh [BUILD_DIR]   (BUILD_DIR is accepted for scripts/test.d and unused)
set -euo pipefail
cd "$(dirname "$0")/.."

# Lowest first. `server/X` entries are the server's floors, in request-path order read from the
# bottom: what a request reaches last (shared types, settings, metrics) lies lowest, the
# transports and the daemon that wires them lie highest. server/main.cpp is on server/app's floor.
FLOORS=(
  log
  kernels
  models
  server/api         # the plain C++ types every server world shares
  server/shm         # shared-memory regions, for every transport
  server/security    # TLS and API access rules, for every transport
  server/config      # server.yaml and serving.yaml
  server/metrics     # Prometheus metrics, statistics helpers
  server/tasks       # request/response rules per task (detector, classifier, segmentation)
  server/repository  # the model repository on disk
  server/scheduler   # queue, batching policy, deadlines (Scheduler)
  server/instance    # a model instance: device, stream, CUDA graphs, worker thread
  server/lifecycle   # load, swap, retire model versions
  server/core        # ServerCore and the inference pipeline
  server/grpc        # the gRPC transport (KServe v2 + health) and the client
  server/http        # the HTTP transport (KServe v2 REST, admin endpoints)
  server/app         # the daemon: wires core and transports
  tools
)

python3 - "${FLOORS[@]}" <<'EOF'
import os
import re
import sys

floors = sys.argv[1:]
rank = {f: i for i, f in enumerate(floors)}
exempt = ("tests/",)
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(path):
    """The floor of a repository path, or None when it is on none (generated code, examples)."""
    if path == "server/main.cpp":
        return "server/app"
    best = None
    for f in floors:
        if path.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


violations = []
checked = 0
for top in ("log", "kernels", "models", "server", "tools"):
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in ("build", "generated"))
        for name in sorted(files):
            if not name.endswith((".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")):
                continue
            path = os.path.join(root, name)
            if path.startswith(exempt):
                continue
            here = floor_of(path)
            if here is None:
                continue
            checked += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = include.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    local = os.path.normpath(os.path.join(root, target))
                    if os.path.exists(local):
                        target = local  # "x.h" next to the file, or "../x.h"
                    there = floor_of(target)
                    if there is not None and rank[there] > rank[here]:
                        violations.append(f"{path}:{number}: {here} includes {target} ({there}), "
                                          f"a higher floor")
for v in violations:
    print(v)
if violations:
    print(f"check-floors: {len(violations)} include(s) point up a floor "
          f"(order: {' -> '.join(floors)})")
    sys.exit(1)
print(f"check-floors: {checked} files, no include points up a floor")
EOF
