#!/usr/bin/env bash
# Deployment checks (tests/deploy/deploy_test.py): manifests parse and render, agree with the
# daemon (ports, health services, config parser, /metrics names), promtool, Dockerfile rules; the
# tls overlay's mounted certificate files equal server.tls, and its server.yaml runs with a test CA.
set -euo pipefail
build=${1:-build}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
python=$venv/bin/python
[ -x "$python" ] || python=python3
exec "$python" tests/deploy/deploy_test.py "$build"
