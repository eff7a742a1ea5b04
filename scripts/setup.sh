#!/usr/bin/env bash
# Installs everything the build and the tests need on Debian 12 (idempotent, non-interactive):
# Debian packages for the C++ dependencies, and a Python virtual environment holding the pinned
# torch==2.11.0 wheel (its LibTorch is what CMake builds against) and the test-only peers.
#
# Environment: LIBREYOLO_VENV (default ~/.cache/libreyolo-server/venv-torch2.11) is where the
# virtual environment lives; it is shared by every checkout on the machine because the torch wheel
# and its CUDA libraries weigh several GiB.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
stamp_dir=$HOME/.cache/libreyolo-server
mkdir -p "$stamp_dir"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

debs=(
  build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  python3 python3-venv python3-dev
  clang libclang-rt-14-dev
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libcivetweb-dev
  libturbojpeg0-dev libpng-dev libcurl4-openssl-dev libssl-dev
  clang-format prometheus
)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi

# Python: the pinned requirements file is the single source of truth for versions.
req="$here/scripts/requirements.txt"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating/updating the virtual environment $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$req"
  echo "$want" > "$venv/.requirements.sha256"
else
  echo "setup: virtual environment $venv up to date"
fi
"$venv/bin/python" -c 'import torch; print("setup: torch", torch.__version__, "at", torch.utils.cmake_prefix_path)'
